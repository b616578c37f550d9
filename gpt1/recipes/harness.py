"""`gpt1 lm-eval`: lm-evaluation-harness on a gpt1 checkpoint (`gpt1.lm_eval.adapter`) with gpt1's
local tasks (`TASKS_DIR`); `simple_evaluate` for programs, and the checks the command makes around
the harness (results folder, arguments and offline downloads refused in one line)."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpt1.errors import ConfigError
from gpt1.files import WriteError, write_failure
from gpt1.lm_eval.adapter import MISSING_CHECKPOINT, MODEL_NAME, register

TASKS_DIR = Path(__file__).resolve().parents[1] / "lm_eval_tasks"  # gpt1/lm_eval_tasks


def simple_evaluate(
    checkpoint: str,
    tasks: list[str],
    data: str | None = None,
    limit: int | float | None = None,
    **model_args: Any,
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` on a gpt1 checkpoint with gpt1's local tasks available, reading
    their data under `data` (the data root or a task's folder, see gpt1/lm_eval_tasks)."""
    register()
    model_args = {"checkpoint": checkpoint, **model_args}
    return evaluate_with_local_tasks(MODEL_NAME, tasks, data, model_args=model_args, limit=limit)


def evaluate_with_local_tasks(
    model: Any, tasks: list[str], data: str | Path | None = None, **kwargs: Any
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate(model=model, tasks=tasks, **kwargs)` for any harness model (a
    name such as `local-completions`, or an `LM` object) with gpt1's local tasks available,
    reading their data under `data`."""
    import lm_eval

    metadata = {"data": str(data)} if data else {}
    return lm_eval.simple_evaluate(
        model=model,
        tasks=tasks,
        metadata=metadata,
        task_manager=task_manager(tasks, metadata),
        **kwargs,
    )


def run_name(checkpoint: str) -> str:
    """The run's name for the harness's output folder: the checkpoint as given (relative to the
    working folder when inside it). The harness names a run from `pretrained=`, `model=` or
    `path=`, and would make up a random name for gpt1's `checkpoint=`."""
    path = Path(str(checkpoint))
    if path.is_absolute():
        with contextlib.suppress(ValueError):
            path = path.relative_to(Path.cwd())
    name = path.as_posix().strip("/")
    return name if name not in ("", ".") else path.resolve().name


def named_model_args(model_args: dict[str, Any] | None) -> dict[str, Any]:
    """gpt1's `--model_args` with `checkpoint` required and `model` (the run's name, read by the
    harness for its output folder) defaulting to `run_name(checkpoint)`."""
    args = dict(model_args or {})
    if not args.get("checkpoint"):
        raise ConfigError(MISSING_CHECKPOINT)
    args.setdefault("model", run_name(args["checkpoint"]))
    return args


def results_folder(output_path: str | None, name: str) -> Path | None:
    """Where the harness writes the results of run `name` for `--output_path` (None: nowhere)."""
    if not output_path:
        return None
    from lm_eval.utils import sanitize_model_name

    path = Path(output_path)
    return path.parent if path.suffix == ".json" else path / sanitize_model_name(name)


def check_writable(folder: Path | None) -> None:
    """Refuse, before evaluating, a results folder that cannot be written: the harness would
    find out only at the end, print a warning and exit 0. Nothing is left behind."""
    if folder is None:
        return
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path.cwd())
    if not existing.is_dir():
        raise ConfigError(f"--output_path: {existing} is not a folder")
    try:  # os.access says yes to root on a read-only mount's files; a real write does not lie
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".gpt1-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise write_failure(folder, exc) from None


def check_saved(folder: Path | None, output_path: str | None, since: float) -> None:
    """Refuse success when the harness could not save results it computed (it only warns)."""
    if folder is None or output_path is None:
        return
    path = Path(output_path)
    pattern = f"{path.stem}_*.json" if path.suffix == ".json" else "results_*.json"
    written = [p for p in folder.glob(pattern) if p.stat().st_mtime >= since - 1]
    if not written:
        raise WriteError(f"{folder}: could not save the results (see the harness's warning)")


@contextlib.contextmanager
def argument_errors() -> Iterator[None]:
    """The harness checks its arguments (tasks asked for and found, --limit against --samples,
    ...) before it evaluates, raising ValueError: those are the user's mistakes, shown as one
    line. Errors raised later (while evaluating) are left as they are."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from_cli, process_tasks = EvaluatorConfig.__dict__["from_cli"], EvaluatorConfig.process_tasks

    def one_line(fn):
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ValueError as exc:
                raise ConfigError(" ".join(str(exc).split())) from None

        return call

    EvaluatorConfig.from_cli = classmethod(one_line(from_cli.__func__))
    EvaluatorConfig.process_tasks = one_line(process_tasks)
    try:
        yield
    finally:
        EvaluatorConfig.from_cli, EvaluatorConfig.process_tasks = from_cli, process_tasks


def _hub_failures() -> tuple[type[BaseException], ...]:
    """What a task's data download raises when the Hugging Face Hub cannot be reached: the
    builtin ConnectionError (datasets, and huggingface_hub's offline mode), requests' own, and
    a file that is neither cached nor reachable."""
    kinds: list[type[BaseException]] = [ConnectionError, TimeoutError]
    with contextlib.suppress(ImportError):
        import requests

        kinds += [requests.exceptions.ConnectionError, requests.exceptions.Timeout]
    with contextlib.suppress(ImportError):
        from huggingface_hub.errors import LocalEntryNotFoundError

        kinds.append(LocalEntryNotFoundError)
    return tuple(kinds)


@contextlib.contextmanager
def offline_errors() -> Iterator[None]:
    """A harness task whose data lives on the Hub, run without a network (or with the download
    failing), ends in one line naming the task, not in the datasets library's traceback."""
    from lm_eval.api.task import ConfigurableTask

    from gpt1.errors import DataError

    download, failures = ConfigurableTask.download, _hub_failures()

    @functools.wraps(download)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return download(self, *args, **kwargs)
        except failures as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise DataError(
                f"lm-eval task {self.config.task!r} downloads its data "
                f"({self.config.dataset_path}) from the Hugging Face Hub, which could not be "
                f"reached (offline, or the download failed: {reason}); gpt1's own tasks "
                "(gpt1_lambada, gpt1_sst2, gpt1_story_cloze) read local files"
            ) from None

    ConfigurableTask.download = checked
    try:
        yield
    finally:
        ConfigurableTask.download = download


def only_local(tasks: list[str]) -> bool:
    """Whether every task named is one of gpt1's local tasks (or their tag)."""
    return bool(tasks) and all(t.strip().startswith("gpt1_") for t in tasks)


def task_manager(tasks: list[str], metadata: dict[str, Any] | None = None) -> Any:
    """A harness TaskManager that knows gpt1's local tasks. When only those are asked for, the
    harness's own ~14,000 task files are not indexed (over a minute on a loaded 2-core CPU)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(
        include_path=str(TASKS_DIR), include_defaults=not only_local(tasks), metadata=metadata or {}
    )
