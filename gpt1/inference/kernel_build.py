"""gpt1's compiled module (`kernels/`: the few-row products of `matvec`, the decoding step,
the int8 passes), built on first use.

It is C++ compiled for this CPU (`-march=native`: AVX-512 or AVX2 with FMA where the CPU has them, plain
loops the compiler vectorises elsewhere; `GPT1_KERNEL_MARCH=x86-64-v3` compiles for another target, to
measure what an AVX2 CPU runs) by torch's extension builder, which takes minutes (`BUILD_TIME`)
and needs a C++ compiler and ninja. It is built once per machine and environment, by the first
process that decodes or by `gpt1 kernels build`, with one line on stderr naming the folder and
one every 10 s saying how long it has taken (`telling`). The folder is in torch's extension folder (`TORCH_EXTENSIONS_DIR`)
under a name that digests the sources and `build_key()`: the CPU's feature flags, torch's
version and install path, the compiler and its version, and the flags; two environments keep
one build each. A build is compiled and proven in child processes and published whole, with a
checksum that every later load checks (`_build`). `gpt1.inference.backend` decides whether the
kernel runs (where it cannot be built: one warning, then torch's kernels, slower, the same
maths); `GPT1_MATVEC=torch` chooses torch's kernels without building.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from gpt1.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock; torch's own marker alone
    fcntl = None

KERNELS = Path(__file__).resolve().parent / "kernels"
SOURCES = (
    "matvec.cpp",
    "step.cpp",
    "choice.cpp",
    "int8_rows.cpp",
    "quantize.cpp",
    "table.cpp",
    "module.cpp",
)  # compiled into one module
HEADERS = ("products.h", "lanes.h")
CHECKSUM = "sha256"  # beside a published build: its library's digest
# The instruction set the kernel is compiled for: `-march=` this (GPT1_KERNEL_MARCH, default
# `native`, this CPU); `x86-64-v3` builds the AVX2+FMA code a laptop runs, to measure it here.
MARCH_VARIABLE = "GPT1_KERNEL_MARCH"
_MARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
# What a build takes, said while it runs: 112-227 s measured on 2 shared cores at loads 1.4-4.9
# (`time gpt1 kernels build` into an empty TORCH_EXTENSIONS_DIR, 2026-12-06:
# docs/commands/kernels.md), about 4 minutes seen at loads 6-9.
BUILD_TIME = "2-5 minutes on 2 cores"
TELL_EVERY = 10.0  # seconds between the lines that say a build or a wait is still going (a newcomer waits at most 15 s for a line)


def build_target() -> str:
    """The `-march=` target of the build: GPT1_KERNEL_MARCH (e.g. `x86-64-v3`), else `native`.
    Raises ConfigError, naming the variable, for a value that is not a target's name."""
    value = os.environ.get(MARCH_VARIABLE, "").strip() or "native"
    if not _MARCH_NAME.fullmatch(value):
        raise ConfigError(
            f"{MARCH_VARIABLE}={value!r} is not a compiler target name (e.g. native, "
            "x86-64-v3, skylake-avx512)"
        )
    return value


def _cflags() -> list[str]:
    # OpenMP: at::parallel_for on torch's threads. No contraction of `a * b + c` into one fused
    # multiply-add where the sources do not ask for one: the compiler would fuse it in some
    # template instantiations and not others, and a row's product must be the same bits
    # whichever rows share it (kernels/matvec.cpp).
    return ["-O3", f"-march={build_target()}", "-fopenmp", "-ffp-contract=off"]


def cpu_flags() -> str:
    """This CPU's feature flags (what -march=native compiles for), or its architecture's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


@functools.cache
def _compiler(cxx: str) -> str:
    """The compiler torch's builder runs (`CXX`, else `c++`) and its version's first line."""
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cxx} {(done.stdout.strip().splitlines() or [''])[0]}"
    except (OSError, subprocess.SubprocessError):
        return f"{cxx} (not runnable)"


def build_key() -> list[str]:
    """What the build depends on besides its sources: the CPU, torch's version and install path
    (another environment's torch is another build), the compiler and its version, the flags."""
    return [
        cpu_flags(),
        torch.__version__,
        str(Path(torch.__file__).resolve().parent),
        _compiler(os.environ.get("CXX", "c++")),
        " ".join(_cflags()),
    ]


def build_name() -> str:
    """The build's folder name: a digest of the sources and `build_key()`."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((KERNELS / name).read_bytes())
    for part in build_key():
        digest.update(part.encode() + b"\0")
    return f"gpt1_matvec_{digest.hexdigest()[:12]}"


def build_root() -> Path:
    """Where builds are kept: `TORCH_EXTENSIONS_DIR`, else torch's default root."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    )
    return Path(root)


def build_folder() -> Path:
    """The folder this environment's build is (or will be) published in."""
    return build_root() / build_name()


def is_built() -> bool:
    """Whether a published build is there and its bytes are the ones that were proven."""
    return _verified(build_folder())


def _verified(folder: Path) -> bool:
    library, checksum = folder / f"{folder.name}.so", folder / CHECKSUM
    try:
        return checksum.read_text().split()[0] == _sha256(library)
    except (OSError, IndexError):
        return False


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def module():
    """gpt1's compiled module (`matvec`; `decode_step`, used by `gpt1.inference.block_step`;
    `quantize_per_tensor`, used by `gpt1.inference.quantize`), built here if it is not published
    yet. Raises where it cannot be built or loaded (`gpt1.inference.backend` decides what then)."""
    return _build()


@functools.cache
def module_if_built():
    """The compiled module where a proven build is published, else None; builds nothing."""
    return _import(build_folder()) if is_built() else None


def forget() -> None:
    """Look for the build again on the next call (tests; after `gpt1 kernels build`)."""
    module.cache_clear()
    module_if_built.cache_clear()


def _build():
    """Find the published build, or build, prove and publish it, then import it.

    A build is compiled in a private folder by a child process, loaded by another child (a
    damaged library kills the child, not this process), given a checksum and published by
    renaming its folder: a published folder is always complete. A published build whose bytes
    no longer match their checksum (truncated, damaged) is removed and rebuilt, never loaded.
    Builders of one folder take turns under an OS lock (`flock`, released however its holder
    dies), and a build or a wait says so on stderr."""
    folder = build_folder()
    if _verified(folder):
        return _import(folder)
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{folder.name}.flock", "a") as guard:
        _take_turn(guard, folder)
        if not _verified(folder):
            damaged = folder.exists()
            shutil.rmtree(folder, ignore_errors=True)
            for stale in root.glob(f".{folder.name}.*"):  # a builder killed midway left it
                shutil.rmtree(stale, ignore_errors=True)
            _say(
                f"{'rebuilding a damaged' if damaged else 'building'} decoding kernel for this "
                f"CPU in {folder} (once, {BUILD_TIME}, less with more; GPT1_MATVEC=torch "
                "skips it)"
            )
            with telling("compiling gpt1 kernels", hint=f"usually {BUILD_TIME}"):
                _publish(folder)
    return _import(folder)


def _take_turn(guard, folder: Path) -> None:
    if fcntl is None:
        return
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _say(
            f"waiting for another process building the decoding kernel in {folder} "
            "(GPT1_MATVEC=torch skips it)"
        )
        with telling("waiting for the kernel's build", hint=f"usually {BUILD_TIME}"):
            fcntl.flock(guard, fcntl.LOCK_EX)


def _say(line: str) -> None:
    """One line on stderr, where a user sees it whatever logging does."""
    print(f"gpt1: {line}", file=sys.stderr, flush=True)


@contextmanager
def telling(what: str, hint: str = "", first: float | None = None) -> Iterator[None]:
    """Say `still WHAT: N s (HINT)` on stderr after `first` seconds (default `TELL_EVERY`) and
    every `TELL_EVERY` seconds after that until the block ends: a wait of minutes with nothing
    on the screen looks hung."""
    done, start = threading.Event(), time.monotonic()
    suffix = f" ({hint})" if hint else ""

    def tell() -> None:
        wait = TELL_EVERY if first is None else first
        while not done.wait(wait):
            _say(f"still {what}: {time.monotonic() - start:.0f} s{suffix}")
            wait = TELL_EVERY

    teller = threading.Thread(target=tell, daemon=True)
    teller.start()
    try:
        yield
    finally:
        done.set()
        teller.join()


def _publish(folder: Path) -> None:
    private = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        library = _compile(private, folder.name)
        _prove(library)
        (private / CHECKSUM).write_text(f"{_sha256(library)}  {library.name}\n")
        private.rename(folder)  # atomic: another process sees no folder or a whole one
    finally:
        shutil.rmtree(private, ignore_errors=True)


_COMPILE = """
import sys
from torch.utils.cpp_extension import load
name, folder, flags, sources = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
load(name=name, sources=sources, extra_cflags=flags, extra_ldflags=["-fopenmp"],
     build_directory=folder, verbose=False)
"""

_PROVE = """
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])
built = importlib.util.module_from_spec(spec)
spec.loader.exec_module(built)
built.has_decode_step()
"""


def _compile(folder: Path, name: str) -> Path:
    """Compile the sources into `folder` in a child process (torch's builder, which also
    imports the result there); the library's path."""
    sources = [str(KERNELS / source) for source in SOURCES]
    _child(_COMPILE, name, str(folder), " ".join(_cflags()), *sources)
    return folder / f"{name}.so"


def _prove(library: Path) -> None:
    """Load `library` in a child process and call it: raises where that fails or crashes."""
    _child(_PROVE, library.stem, str(library))


def _child(script: str, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise RuntimeError(f"gpt1's decoding kernel failed to build or load ({why[:200]})")


def _import(folder: Path):
    """Import the published library (its bytes were checked against their checksum)."""
    name = folder.name
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.so")
    built = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(built)
    sys.modules[name] = built
    return built
