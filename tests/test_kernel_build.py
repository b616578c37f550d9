"""The compiled kernel's build (`gpt1.inference.kernel_build`): keyed by the environment, compiled and
proven in child processes, published whole with a checksum; a damaged cached build is rebuilt,
never loaded; a build or a wait says so on stderr. The compiler is replaced by a fake that
writes a small file (a real build takes minutes), except where a child really loads a file."""

import threading
import time
import types

import pytest

from gpt1.inference import backend, kernel_build

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


class FakeCompiler:
    """Stands in for `_compile`/`_prove`/`_import`: a "library" is a text file; loading checks
    that it is whole, as a dynamic loader would find a truncated one unusable."""

    MARK = "gpt1-fake-library"

    def __init__(self) -> None:
        self.built: list[str] = []  # the build names compiled, in order
        self.loaded: list[str] = []

    def compile(self, folder, name):
        self.built.append(name)
        library = folder / f"{name}.so"
        library.write_text(f"{self.MARK} {name} " + "x" * 4000 + " end")
        return library

    def prove(self, library):
        if not library.read_text().endswith(" end"):
            raise RuntimeError("gpt1's decoding kernel failed to build or load (bad ELF)")

    def load(self, folder):
        text = (folder / f"{folder.name}.so").read_text()
        assert text.endswith(" end"), "a damaged library was loaded"
        self.loaded.append(folder.name)
        return types.SimpleNamespace(
            name=folder.name, matvec=lambda x, w: None, set_one_row_stream=lambda pairs, on: on
        )


@pytest.fixture
def fake(monkeypatch, tmp_path):
    compiler = FakeCompiler()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("GPT1_MATVEC", raising=False)
    monkeypatch.setattr(kernel_build, "_compile", compiler.compile)
    monkeypatch.setattr(kernel_build, "_prove", compiler.prove)
    monkeypatch.setattr(kernel_build, "_import", compiler.load)
    kernel_build.forget()
    yield compiler
    kernel_build.forget()  # the next test finds the real build again


def test_a_build_is_published_whole_with_its_checksum_and_says_so(fake, tmp_path, capsys):
    killed = (
        tmp_path / f".{kernel_build.build_name()}.abc123"
    )  # what a builder killed midway leaves
    killed.mkdir(parents=True)
    built = kernel_build.module()
    folder = kernel_build.build_folder()
    assert built.name == folder.name and fake.built == [folder.name]
    assert kernel_build.is_built()
    assert sorted(p.name for p in folder.iterdir()) == [f"{folder.name}.so", kernel_build.CHECKSUM]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no private folder left
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder) in err[0] and "GPT1_MATVEC=torch" in err[0]
    kernel_build.forget()
    kernel_build.module()  # found, checked, loaded: no build, no line
    assert fake.built == [folder.name] and capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", ["truncated", "bytes changed"])
def test_a_damaged_cached_build_is_rebuilt_never_loaded(fake, damage, capsys):
    kernel_build.module()
    library = kernel_build.build_folder() / f"{kernel_build.build_name()}.so"
    data = library.read_bytes()
    if damage == "truncated":
        library.write_bytes(data[: len(data) // 3])
    else:
        library.write_bytes(data[:100] + b"\xcc" * 64 + data[164:])  # the same size
    capsys.readouterr()
    kernel_build.forget()
    assert not kernel_build.is_built() and kernel_build.module_if_built() is None
    kernel_build.forget()
    assert (
        kernel_build.module().name == kernel_build.build_name()
    )  # FakeCompiler.load asserts it is whole
    assert len(fake.built) == 2 and kernel_build.is_built()
    assert "rebuilding a damaged" in capsys.readouterr().err


def test_a_library_that_does_not_load_in_a_child_is_not_published(fake, monkeypatch):
    def broken(folder, name):
        library = folder / f"{name}.so"
        library.write_text("not a library")  # the prover's child fails to load it
        return library

    monkeypatch.setattr(kernel_build, "_compile", broken)
    with pytest.raises(RuntimeError, match="failed to build or load"):
        kernel_build.module()
    assert not kernel_build.build_folder().exists() and not kernel_build.is_built()


def test_a_child_really_refuses_a_damaged_library(tmp_path):
    """The real prover: a library with damaged bytes fails in the child, not in this process."""
    library = tmp_path / "gpt1_matvec_damaged.so"
    library.write_bytes(b"\x7fELF" + b"\x00" * 12 + b"\xcc" * 2000)
    with pytest.raises(RuntimeError, match="failed to build or load"):
        kernel_build._prove(library)


def test_two_environments_alternating_build_once_each(fake, monkeypatch):
    """Another environment (here another compiler; torch's install path and the flags are in
    the key too) keeps a build of its own: alternating never rebuilds."""
    folders = []
    for cxx in ["c++", "other-c++", "c++", "other-c++", "c++"]:
        monkeypatch.setenv("CXX", cxx)
        kernel_build.forget()
        kernel_build.module()
        folders.append(kernel_build.build_folder())
    assert folders[0] != folders[1] and len(set(folders)) == 2
    assert len(fake.built) == 2
    monkeypatch.setattr(
        kernel_build.torch, "__file__", "/another/env/site-packages/torch/__init__.py"
    )
    assert kernel_build.build_name() != folders[-1].name  # torch from another environment


def test_a_build_in_another_process_is_waited_for_with_one_line(fake, monkeypatch):
    if fcntl is None:
        pytest.skip("no flock here")
    said = []
    monkeypatch.setattr(kernel_build, "_say", said.append)
    folder = kernel_build.build_folder()
    folder.parent.mkdir(parents=True, exist_ok=True)
    guard = open(folder.parent / f"{folder.name}.flock", "a")
    fcntl.flock(guard, fcntl.LOCK_EX)  # another builder holds the turn
    done = []
    waiter = threading.Thread(target=lambda: done.append(kernel_build.module()))
    waiter.start()
    deadline = time.monotonic() + 30
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said and "waiting for another process" in said[0] and str(folder) in said[0]
    assert not done  # still waiting
    fcntl.flock(guard, fcntl.LOCK_UN)
    guard.close()
    waiter.join(30)
    assert done and fake.built == [folder.name]


def test_a_process_that_does_not_decode_does_not_build(fake, monkeypatch):
    backend.reset()
    try:
        assert backend.few_rows_kernel() is None and fake.built == []  # nothing built
        backend.expect_decoding()
        backend.few_rows_kernel()
        assert fake.built == [kernel_build.build_name()]
        backend.reset()
        assert backend.few_rows_kernel() is not None  # built now: used without decoding
        monkeypatch.setenv("CXX", "another-c++")  # another environment, nothing built there
        backend.reset()
        assert backend.few_rows_kernel() is None
        monkeypatch.setenv("GPT1_MATVEC", "On")  # asked for: built even without decoding
        assert backend.few_rows_kernel() is not None and len(fake.built) == 2
    finally:
        backend.reset()


def test_gpt1_kernels_build_prints_the_folder(fake, capsys):
    from gpt1.cli import main

    assert main(["kernels", "build"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"built: {kernel_build.build_folder()}"]
    assert main(["kernels", "build"]) == 0
    assert capsys.readouterr().out.strip() == f"already built: {kernel_build.build_folder()}"


def test_a_long_build_says_how_long_it_has_taken_while_it_runs(fake, monkeypatch):
    """A real build is minutes of compiling: a line with the time so far, every TELL_EVERY
    seconds (10 s; here 0.05 s), so it does not look hung."""
    said = []
    monkeypatch.setattr(kernel_build, "_say", said.append)
    monkeypatch.setattr(kernel_build, "TELL_EVERY", 0.05)
    compile_now = fake.compile

    def slow_compile(folder, name):
        time.sleep(0.4)
        return compile_now(folder, name)

    monkeypatch.setattr(kernel_build, "_compile", slow_compile)
    kernel_build.module()
    still = [line for line in said if line.startswith("still compiling gpt1 kernels: ")]
    assert "building decoding kernel" in said[0] and kernel_build.BUILD_TIME in said[0]
    assert len(still) >= 2 and f"(usually {kernel_build.BUILD_TIME})" in still[0]
    count = len(said)
    time.sleep(0.2)
    assert len(said) == count  # silent once the build is over
