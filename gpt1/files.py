"""What touches a user's disk: atomic files and folders, fsync, the run lock, the overwrite policy.

One policy for every command that writes: nothing it did not create in this run is deleted or
replaced unless the user passes `--overwrite`; no output is, holds or lies inside one of the
command's own inputs, with or without `--overwrite` (`check_inputs`, real paths compared); a
refused command changes nothing on disk (no folder made, no lock file left); a run folder is
either resumed (`--resume`) or refused, never mixed; one process at a time writes a run folder (an
advisory `flock` on `RUN/.gpt1.lock`, released by the kernel when the holder dies, even by
SIGKILL). Every write failure (disk full, read-only folder, no permission) becomes one `WriteError`
line naming the path and what was needed, and leaves no temporary file or folder behind; so does
Ctrl-C or SIGTERM while a temporary exists (`temporary`, `atomic_folder`).

Files are published by writing a hidden temporary sibling (`.NAME.tmp-PID`), fsyncing it and
renaming it onto the final name, so a reader never sees half a file. They follow the user's umask
(safetensors writes its files with mode 0600; they are widened to what `open` would give).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gpt1.errors import DataError, Gpt1Error

log = logging.getLogger(__name__)

LOCK_FILE = ".gpt1.lock"
_TEMP_KINDS = ("tmp-", "old-", "deleting-")


class WriteError(Gpt1Error):
    """A file or folder could not be written (disk full, read-only folder, no permission)."""

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_


class OutputExists(DataError):
    """The output already holds something this run did not create (and --overwrite was not given)."""


class OutputIsInput(OutputExists):
    """The output is, holds or lies inside one of the command's inputs (refused even with
    --overwrite)."""


class RunLocked(Gpt1Error):
    """Another process holds the run folder's lock."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an exception while a temporary is on disk so that it is removed
    (a KeyboardInterrupt, so every cleanup that handles Ctrl-C handles it too)."""


# ---------------------------------------------------------------------------- failures
def _human(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def _errno_of(exc: BaseException) -> int | None:
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    text = str(exc)  # safetensors reports I/O errors as SafetensorError("... (os error 28)")
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO):
        if f"os error {code})" in text or os.strerror(code) in text:
            return code
    return None


def write_failure(path: str | Path, exc: BaseException, needed: int | None = None) -> WriteError:
    """The one-line error for a failed write of `path` (what failed, and what was needed)."""
    path = Path(path)
    code = _errno_of(exc)
    reason = (
        os.strerror(code)
        if code
        else (getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__)
    )
    reason = reason.splitlines()[0][:200]
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(path)
        need = f"needs about {_human(needed)}" if needed else "needs more space"
        have = f", {_human(free)} free there" if free is not None else ""
        hint = f"{need}{have}"
    elif code in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "needs a writable folder"
    else:
        hint = "needs a working disk"
    return WriteError(f"{path}: could not write ({reason}; {hint})", code)


def _is_write_failure(exc: BaseException, *ours: Path) -> bool:
    if isinstance(exc, OSError):
        # An OSError about some other file (an input that cannot be read) is not ours to explain.
        name = exc.filename
        if name is None or isinstance(name, int):
            return True
        target = Path(os.fsdecode(name)).absolute()
        return any(
            target == p or target.is_relative_to(p) or p.is_relative_to(target)
            for p in (o.absolute() for o in ours)
        )
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return False
    return isinstance(exc, SafetensorError)


@contextlib.contextmanager
def writing(
    path: str | Path, needed: int | None = None, cleanup: str | Path | None = None
) -> Iterator[None]:
    """Turn an OSError/SafetensorError inside the block into a `WriteError` about `path`,
    after removing `cleanup` (a temporary file or folder) so nothing half-written stays.

    Exceptions, Ctrl-C and SIGTERM (inside `sigterm_raises`) are cleaned up after; a process
    SIGKILLed mid-write leaves its temporary for the next writer of the same name (`atomic_dir`)
    or the next checkpoint (`prune_steps`) to delete."""
    try:
        yield
    except BaseException as exc:  # Ctrl-C and SIGTERM (`Terminated`) clean up too
        if cleanup is not None:
            remove(cleanup)
        ours = (Path(path),) + ((Path(cleanup),) if cleanup is not None else ())
        if isinstance(exc, Exception) and _is_write_failure(exc, *ours):
            raise write_failure(path, exc, needed) from None
        raise


def remove(path: str | Path) -> None:
    """Delete a file or folder we created, ignoring errors (best effort on a failing disk)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# --------------------------------------------------------------------------- permissions
def current_umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path) -> None:
    """Give a file we wrote the mode a plain `open(..., "w")` would have (0666 minus the umask)."""
    os.chmod(path, 0o666 & ~current_umask())


# ------------------------------------------------------------------------------ fsync
def fsync_dir(path: str | Path) -> None:
    """fsync every file directly inside `path`, then the folder itself (its entries)."""
    path = Path(path)
    for child in path.iterdir() if path.is_dir() else []:
        if child.is_file():
            with open(child, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------ atomic writes
def _temp_name(final: Path, kind: str = "tmp") -> Path:
    return final.parent / f".{final.name}.{kind}-{os.getpid()}"


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises `Terminated` in the main thread, so the cleanup of
    whatever temporary the block writes runs (SIGTERM's default would end the process on the
    spot). A process that already handles SIGTERM itself (the trainer, which checkpoints and
    stops) keeps its own handler; so do other threads, where signals cannot be handled."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _dead_temporary(entry: Path) -> bool:
    """A `.NAME.KIND-PID` left by a process that is gone (or by this one, from an earlier try)."""
    kind_pid = entry.name.rsplit(".", 1)[-1]
    if not kind_pid.startswith(_TEMP_KINDS):
        return False
    pid = kind_pid.rsplit("-", 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False  # alive: another writer's temporary (it cleans up after itself)


def atomic_dir(final: str | Path) -> Path:
    """A fresh temporary sibling of `final`; publish it with `publish_dir`."""
    final = Path(final)
    tmp = _temp_name(final)
    with writing(final.parent):
        final.parent.mkdir(parents=True, exist_ok=True)
        # Torn temporary/old folders of this name left by a killed process (and our own stale one).
        for stale in final.parent.glob(f".{glob.escape(final.name)}.*"):
            if stale.is_dir() and _dead_temporary(stale):
                shutil.rmtree(stale, ignore_errors=True)
    with writing(tmp, cleanup=tmp):
        tmp.mkdir()
    return tmp


def publish_dir(tmp: str | Path, final: str | Path) -> None:
    """Rename a completed temporary folder onto `final` (replacing an older one)."""
    tmp, final = Path(tmp), Path(final)
    fsync_dir(tmp)
    if final.exists() or final.is_symlink():
        old = _temp_name(final, "old")
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except BaseException:
            os.replace(old, final)  # put the previous output back: never neither
            raise
        remove(old)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def temporary(final: str | Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a fresh temporary sibling of `final` (`atomic_dir`); on any failure, Ctrl-C or
    SIGTERM it is removed (write failures become a `WriteError` naming `final`). Publishing it
    is the caller's (`publish_dir`), inside the block."""
    final = Path(final)
    with sigterm_raises():
        tmp = atomic_dir(final)
        with writing(final, needed, cleanup=tmp):
            yield tmp


@contextlib.contextmanager
def atomic_folder(final: str | Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `final`, on any failure, Ctrl-C or
    SIGTERM it is removed (write failures become a `WriteError` naming `final`)."""
    with temporary(final, needed) as tmp:
        yield tmp
        publish_dir(tmp, final)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (temporary sibling, fsync, rename)."""
    path = Path(path)
    tmp = _temp_name(path)
    with sigterm_raises(), writing(path, len(data), cleanup=tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return path


def write_files(folder: str | Path, contents: dict[str, bytes]) -> list[Path]:
    """Write each file of `contents` ({name: bytes}) into `folder` atomically (`write_bytes`):
    a set of outputs made in full first (a run's plots), so that one that cannot be made
    leaves none of them half-replaced."""
    return [write_bytes(Path(folder) / name, data) for name, data in contents.items()]


def write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any, indent: int | None = 2) -> Path:
    """Write `data` as JSON (plus a newline) to `path` atomically."""
    return write_text(path, json.dumps(data, indent=indent) + "\n")


# ---------------------------------------------------------------------- overwrite policy
def is_empty(folder: Path) -> bool:
    """True for a missing folder or one holding nothing but our lock file."""
    return not folder.exists() or (
        folder.is_dir() and all(p.name == LOCK_FILE for p in folder.iterdir())
    )


def _listing(folder: Path, limit: int = 4) -> str:
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE)
    more = f", ... ({len(names)} entries)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _real(path: str | Path) -> Path:
    """`path` with every symlink resolved (the parts that exist), made absolute."""
    return Path(os.path.realpath(path))


def check_inputs(
    output: str | Path,
    inputs: Iterable[str | Path | None],
    roots: Iterable[str | Path | None] = (),
) -> None:
    """THE input rule: no command deletes or replaces anything that is, holds or lies inside one
    of its inputs, with or without --overwrite. Real paths are compared (symlinks resolved).

    `inputs` are what the command reads in full (files, or folders read as a whole such as a
    corpus folder): an output that is one, holds one, or lies inside one and already exists
    (so would be replaced or emptied) is refused. `roots` are folders the command reads only
    some files of (a task's data root, a checkpoint or tokenizer folder, whose files the caller
    lists in `inputs`): an output that is or holds one is refused, while a new file beside their
    files (results.json next to the weights, a run folder under a data root) is not. Inputs that
    do not exist (`hf:NAME`, an empty flag) hold nothing to lose and are skipped."""
    out = _real(output)
    exists = Path(output).exists() or Path(output).is_symlink()
    for src, whole in [*((s, True) for s in inputs), *((r, False) for r in roots)]:
        if src is None or not str(src) or not (Path(src).exists() or Path(src).is_symlink()):
            continue
        real = _real(src)
        if real == out:
            how = "is"
        elif real.is_relative_to(out):
            how = "holds"
        elif whole and out.is_relative_to(real) and (exists or not real.is_dir()):
            how = "lies inside"
        else:
            continue
        raise OutputIsInput(
            f"{output}: {how} {src}, an input of this command; no command deletes, replaces "
            "or writes into its own inputs, even with --overwrite. Choose another output"
        )


_NOT_READABLE_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_data_path(path: str | Path) -> str:
    """Why `path`, given as input data, is neither a file nor a folder, in words for a
    DataError naming it: missing, a dangling symlink, a symlink loop, unreadable, or a device,
    FIFO or socket (reading /dev/zero or a pipe would never end or never repeat)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (the links point at each other), not a file or folder"
        if exc.errno == errno.ENOENT and path.is_symlink():
            return f"a symlink to {os.readlink(path)}, which does not exist"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return "not readable (permission denied)"
        if exc.errno == errno.ENOTDIR:
            return "no such file or folder (a part of the path is a file)"
        return "no such file or folder" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
    for is_kind, name in _NOT_READABLE_KINDS:
        if is_kind(mode):
            return f"is {name}, not a file or folder"
    return "not a regular file or folder"


def entries(folder: Path) -> dict[Path, os.stat_result | None]:
    """Every path under `folder` now, with the times of the folders among them and of `folder`
    itself: what `remove_new` gives back."""
    if not folder.is_dir():
        return {}
    found: dict[Path, os.stat_result | None] = {folder: folder.stat()}
    for path in folder.rglob("*"):
        found[path] = path.stat() if path.is_dir() and not path.is_symlink() else None
    return found


def remove_new(folder: Path, existed: dict[Path, os.stat_result | None]) -> None:
    """Delete what appeared under `folder` since `entries` gave `existed` (deepest first) and
    give the folders that held it their times back: a run or a tracker that failed before it
    produced anything leaves the folder as it found it (files it changed stay changed)."""
    new = sorted(set(entries(folder)) - set(existed), key=lambda p: len(p.parts), reverse=True)
    for path in new:
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for path, info in existed.items():
        if info is not None:
            with contextlib.suppress(OSError):
                os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def folder_files(path: str | Path | None) -> list[Path]:
    """The files a reader of folder `path` may open (every plain file directly inside it), or
    `path` itself when it is not a folder: the `inputs` of a `roots` entry for `check_inputs`."""
    if path is None or not str(path):
        return []
    path = Path(path)
    if not path.is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.name != LOCK_FILE)


def check_output(
    path: str | Path,
    overwrite: bool,
    sources: Iterable[str | Path | None] = (),
    roots: Iterable[str | Path | None] = (),
) -> None:
    """Refuse an output that is, holds or lies inside one of `sources` or `roots` (the command's
    inputs: always, `check_inputs`), and an existing file or non-empty folder at `path` unless
    `overwrite`; even with it, refuse to replace the current folder or one above it."""
    path = Path(path)
    check_inputs(path, sources, roots)
    for above in path.parents:  # the nearest that exists must be a folder to write into
        if above.exists():
            if not above.is_dir():
                raise OutputExists(
                    f"{path}: cannot be written, {above} is a file, not a folder; choose a "
                    "folder for the output"
                )
            break
    if not (path.exists() or path.is_symlink()):
        return
    if overwrite:
        check_replaceable(path)
        return
    if path.is_dir() and not path.is_symlink():
        if is_empty(path):
            return
        raise OutputExists(
            f"{path}: output folder is not empty (holds {_listing(path)}); "
            "pass --overwrite to replace it, or choose another output"
        )
    raise OutputExists(f"{path}: exists; pass --overwrite to replace it, or choose another output")


def check_replaceable(dst: str | Path, *sources: str | Path) -> None:
    """Refuse, even with --overwrite, to replace a folder that holds one of `sources`
    (`check_inputs`) or the current working directory (`.`, `..`, `/`): replacing it would delete
    what is being read or the folder the user stands in."""
    check_inputs(dst, sources)
    if Path.cwd().resolve().is_relative_to(Path(dst).resolve()):
        raise OutputExists(
            f"{Path(dst).resolve()}: is the current folder or one above it; choose another "
            "output folder"
        )


def clear_folder(folder: Path) -> None:
    """Delete everything in `folder` but the lock file (for --overwrite of a run folder).

    Each entry is renamed to a hidden name first, so a kill mid-delete never leaves something
    that looks like a half-deleted checkpoint."""
    for entry in sorted(folder.iterdir()):
        if entry.name == LOCK_FILE:
            continue
        trash = folder / f".{entry.name}.deleting-{os.getpid()}"
        with writing(entry):
            os.replace(entry, trash)
        remove(trash)


# ------------------------------------------------------------------------------ run lock
def _command_line() -> str:
    """This process's command line, as the user typed it for `gpt1` / `python -m gpt1`."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    first = script.parent.name if script.name == "__main__.py" else script.name  # python -m X
    return shlex.join([first, *sys.argv[1:]])


class RunLock:
    """An exclusive advisory lock on a folder (`flock` on FOLDER/.gpt1.lock), held for a run.

    The lock file records who holds it (pid, host, command, start time) so a second writer is
    told whom it waits for. The kernel drops the lock when the holder exits or is killed, so a
    SIGKILLed run never blocks the next one; the file itself stays (empty) and is harmless. A
    lock whose run wrote nothing leaves nothing: on release the lock file it created is removed,
    and the folder too when the lock made it and it is empty.
    """

    def __init__(self, folder: str | Path, command: str | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.command = command or _command_line()
        self._fd: int | None = None
        self._made_folders: list[Path] = []  # the folder and missing parents it created
        self._made_file = False
        # What the folder held once `claim_run_dir` claimed it (`entries`): a run that fails
        # before it produced anything gives it back as it was (`remove_new`).
        self.found: dict[Path, os.stat_result | None] = {}

    def _open(self) -> int:
        """The lock file's descriptor, opened (and created, noting what this lock made)."""
        with writing(self.path):
            if not self.folder.exists():
                missing = [self.folder, *(p for p in self.folder.parents if not p.exists())]
                self.folder.mkdir(parents=True)
                self._made_folders = missing
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
                self._made_file = True
            except FileExistsError:
                fd = os.open(self.path, os.O_RDWR)
        return fd

    def acquire(self) -> RunLock:
        for attempt in range(8):  # the file unlinked by a releasing holder between open and flock
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.tidy()
                raise RunLocked(
                    f"{self.folder}: in use by another gpt1 process ({self.holder()}); "
                    "wait for it to finish or stop it, or choose another folder"
                ) from None
            except OSError as exc:  # a filesystem without flock (some network mounts)
                log.warning(
                    "%s: cannot lock (%s); make sure no other process writes here",
                    self.path,
                    exc.strerror,
                )
                os.close(fd)
                return self
            if self._still_linked(fd) or attempt == 7:
                break
            os.close(fd)
        self._fd = fd
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.command[:500],
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        with contextlib.suppress(OSError):  # the lock holds even if the note cannot be written
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        return self

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False

    def holder(self) -> str:
        """Who holds the lock, as written in the lock file (best effort)."""
        try:
            info = json.loads(self.path.read_text() or "{}")
            return (
                f"pid {info['pid']} on {info['host']}, `{info['command']}`, since {info['started']}"
            )
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def tidy(self) -> None:
        """Remove what this lock made (its file, its folder) when nothing else was written."""
        with contextlib.suppress(OSError):
            if not is_empty(self.folder):
                return  # the run wrote something: the lock file and its folders stay
            if self._made_file:
                self.path.unlink()
                self._made_file = False
            while self._made_folders and not any(self._made_folders[0].iterdir()):
                self._made_folders.pop(0).rmdir()

    def release(self) -> None:
        if self._fd is None:
            self.tidy()
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        self.tidy()  # while still held: no second process can be mid-run in an empty folder
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _refuse_used_folder(folder: Path) -> None:
    raise OutputExists(
        f"{folder}: run folder is not empty (holds {_listing(folder)}); pass --resume "
        "auto to continue that run, --overwrite to start it over (deletes them), or "
        "choose a new --out"
    )


def claim_run_dir(
    folder: str | Path,
    resume: bool,
    overwrite: bool,
    command: str | None = None,
    inputs: Iterable[str | Path | None] = (),
    roots: Iterable[str | Path | None] = (),
) -> RunLock:
    """Lock a run folder for this process and apply the run-folder policy.

    A folder that is, holds or lies inside one of `inputs` or `roots` is refused (`check_inputs`). An empty
    or missing folder is a new run. A non-empty one is continued only with `resume`, replaced
    (emptied) only with `overwrite`, and refused otherwise. Every refusal comes before anything
    is written (no folder, no lock file). Returns the held lock, which notes what the folder
    held once claimed (`RunLock.found`); the caller releases it when the run ends (which removes
    the lock file and folder again if the run wrote nothing).
    """
    folder = Path(folder)
    check_inputs(folder, inputs, roots)
    if resume and overwrite:
        raise OutputExists(
            "--resume and --overwrite exclude each other: continue the run or "
            "start it over, not both"
        )
    if folder.exists() and not folder.is_dir():
        raise OutputExists(f"{folder}: exists and is not a folder; choose another output folder")
    if overwrite and folder.exists():
        check_replaceable(folder)
    if not resume and not overwrite and not is_empty(folder):
        _refuse_used_folder(folder)  # before the lock file is made
    lock = RunLock(folder, command).acquire()
    try:
        if not resume and not is_empty(folder):  # filled meanwhile, or --overwrite
            if not overwrite:
                _refuse_used_folder(folder)
            clear_folder(folder)
        lock.found = entries(folder)
    except BaseException:
        lock.release()
        raise
    return lock
