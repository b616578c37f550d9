"""Experiment trackers: TensorBoard, Weights & Biases and MLflow behind one small interface.

`metrics.jsonl` is always written (gpt1.train.telemetry); `train.loggers` names the trackers
that receive the same records besides it. `Trackers` is what telemetry talks to: `open` (on
rank 0, once the resumed step is known), `log(record)`, `summary(values, step)`, `close`.
Each tracker records how to find its run again in `RUN/trackers.json`; a resumed run re-attaches
to the same tracker run and sends no step twice:

- tensorboard: events in RUN/tensorboard, flushed at every record; on resume, metric points at or
  below the last step `metrics.jsonl` had before the resume are skipped;
- wandb: offline files in RUN/wandb (online when an account is configured); skipped the same way;
- mlflow: a SQLite store in RUN/mlflow.db by default (or `train.mlflow_uri`); on resume, points
  at or below the last step the store holds for that metric are skipped.

A tracker that fails while logging is reported once and dropped; metrics.jsonl stays complete.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from gpt1.config import LOGGERS as TRACKERS
from gpt1.config import file_inside
from gpt1.errors import ConfigError
from gpt1.extras import install_line
from gpt1.files import entries, remove_new, write_json

log = logging.getLogger("gpt1.train")

EXTRA = "track"
# The module each tracker imports, and the pip package that provides it.
_MODULES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}
# What starting each tracker imports: imported by `require`, so that a package that is
# installed but broken is refused before the run folder is made, as a missing one is.
_IMPORTS = {
    "tensorboard": ("torch.utils.tensorboard",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow.tracking", "mlflow.entities"),
}
RECORD_FILE = "trackers.json"


def parse_loggers(text: str, source: str = "train.loggers") -> tuple[str, ...]:
    """'jsonl,wandb' -> ('jsonl', 'wandb'), each name checked, duplicates dropped."""
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in TRACKERS:
            raise ConfigError(
                f"{source}: unknown logger {raw.strip()!r}; choose from {', '.join(TRACKERS)}"
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def require(names: tuple[str, ...] | str) -> None:
    """A one-line ConfigError naming the extra to install when a tracker's package is missing,
    or what failed when it is installed but does not import (each imported here, before the
    caller touches the run folder)."""
    if isinstance(names, str):
        names = parse_loggers(names)
    for name in names:
        if name == "jsonl":
            continue
        module, package = _MODULES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"--logger {name} needs the {package} package, which is not installed: "
                f"{install_line(EXTRA)} (or pip install {package})"
            )
        for imported in _IMPORTS[name]:
            try:
                importlib.import_module(imported)
            except Exception as exc:  # noqa: BLE001 - any failure of a broken install
                raise ConfigError(
                    f"--logger {name}: the {package} package is installed but does not import "
                    f"({type(exc).__name__}: {_first_line(exc)}); reinstall it (pip install "
                    f"--force-reinstall {package}) or leave out --logger {name}"
                ) from None


def command_line(argv: list[str] | None = None) -> str:
    """The command that started this process, as a user would type it (`gpt1 ...`)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and (argv[0].endswith(("gpt1/__main__.py", "gpt1")) or argv[0] == "-m"):
        argv[0] = "gpt1"
    return shlex.join(argv)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} -> {'train.lr': 1}; lists and None become strings."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


class Trackers:
    """The external trackers of one run (empty with only `jsonl`); only rank 0 opens them."""

    def __init__(
        self,
        run_dir: Path,
        loggers: str,
        *,
        config: dict[str, Any] | None = None,
        command: str | None = None,
        project: str = "gpt1",
        mlflow_uri: str = "",
    ):
        self.run_dir = Path(run_dir)
        self.names = tuple(n for n in parse_loggers(loggers) if n != "jsonl")
        require(self.names)
        self.config = config or {}
        self.command = command or command_line()
        self.project = project or "gpt1"
        self.mlflow_uri = mlflow_uri
        self.open_ones: list[Any] = []

    def open(
        self,
        resume_step: int | None,
        logged: dict[str, int] | None = None,
        history: list[dict[str, Any]] | None = None,
    ) -> None:
        """Start (or, on resume, re-attach to) every tracker. On resume, `logged` maps each
        metric to the last step metrics.jsonl held before it was cut back to `resume_step`,
        and `history` is what it kept: a tracker first named on a resumed run gets that
        history first, so it too holds the whole run."""
        if not self.names:  # metrics.jsonl only: nothing to start, nothing to clean up after
            return
        record_file = self.run_dir / RECORD_FILE
        records = _read_records(record_file) if resume_step is not None else {}
        existed = entries(self.run_dir)
        for name in self.names:
            kind, record = _KINDS[name], records.get(name)
            try:
                # Only a re-attached tracker has points to skip; a new one has none.
                tracker = kind.start(self, record, resume_step, (logged or {}) if record else {})
                self.open_ones.append(tracker)
                if record is None:
                    for past in history or []:
                        tracker.log(_numbers(past), int(past["step"]))
            except Exception as exc:  # a tracker's own failure (server, credentials, files)
                self.close("FAILED")
                remove_new(self.run_dir, existed)  # a refused start leaves the folder as it was
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(
                    f"--logger {name}: could not start ({_first_line(exc)})"
                ) from None
            records[name] = tracker.record
        write_json(record_file, records)

    def log(self, record: dict[str, Any]) -> None:
        self._each("log", _numbers(record), int(record["step"]))

    def summary(self, values: dict[str, Any], step: int) -> None:
        """Final figures of a run (fine-tuning's results.json), numeric entries only."""
        numbers = {k: float(v) for k, v in flatten(values).items() if _is_number(v)}
        if numbers:
            self._each("summary", numbers, step)

    def close(self, status: str = "FINISHED") -> None:
        """status: FINISHED, KILLED (stopped by a signal) or FAILED."""
        while self.open_ones:
            tracker = self.open_ones.pop()
            try:
                tracker.close(status)
            except Exception as exc:  # closing must not hide the run's own outcome
                log.warning("%s: could not close cleanly (%s)", tracker.name, _first_line(exc))

    def _each(self, method: str, values: dict[str, float], step: int) -> None:
        for tracker in list(self.open_ones):
            try:
                getattr(tracker, method)(values, step)
            except Exception as exc:
                log.warning(
                    "--logger %s failed (%s); it is dropped, metrics.jsonl continues",
                    tracker.name,
                    _first_line(exc),
                )
                self.open_ones.remove(tracker)


# ---------------------------------------------------------------------------- the trackers
class TensorBoard:
    """Scalars under the metrics.jsonl names; the config as hparams and text; the command."""

    name = "tensorboard"

    def __init__(self, writer: Any, logdir: str, logged: dict[str, int]):
        self.writer, self.record, self.logged = writer, {"logdir": logdir}, logged

    @classmethod
    def start(cls, owner: Trackers, record: dict | None, resume_step: int | None, logged: dict):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        logdir = (record or {}).get("logdir", "tensorboard")
        folder = file_inside(owner.run_dir, logdir)  # trackers.json names a folder of the run
        # No purge_step: the points already written stay, and the replay skips them, so that
        # the event files themselves never hold a step twice (whatever program reads them).
        writer = SummaryWriter(str(folder), flush_secs=30)
        if record is None:  # a new TensorBoard run: hyper-parameters once
            flat = flatten(owner.config)
            for summary in hparams(flat, {}):
                writer.file_writer.add_summary(summary)
            text = json.dumps(owner.config, indent=2)
            writer.add_text("config", f"```\n{text}\n```", 0)
        writer.add_text("command", owner.command, resume_step or 0)
        writer.flush()
        return cls(writer, logdir, dict(logged))

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            if step > self.logged.get(key, -1):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()  # what metrics.jsonl holds, the event file holds: resume relies on it

    def summary(self, values: dict[str, float], step: int) -> None:
        self.log({f"final/{k}": v for k, v in values.items()}, step)

    def close(self, status: str) -> None:
        self.writer.close()


class Wandb:
    """Offline run files in RUN/wandb unless WANDB_MODE or a configured account says online."""

    name = "wandb"

    def __init__(self, run: Any, record: dict, logged: dict[str, int]):
        self.run, self.record, self.logged = run, record, logged

    @classmethod
    def start(cls, owner: Trackers, record: dict | None, resume_step: int | None, logged: dict):
        import wandb

        run_id = (record or {}).get("id") or secrets.token_hex(4)  # W&B ids: [a-z0-9]
        mode = _wandb_mode()
        if mode == "offline":
            log.info(
                "wandb: run %s logged offline in %s; upload it with `wandb sync --id %s %s`",
                run_id,
                owner.run_dir / "wandb",
                run_id,
                owner.run_dir / "wandb" / "offline-run-*",
            )
        run = wandb.init(
            project=owner.project,
            name=owner.run_dir.name,
            id=run_id,
            dir=str(owner.run_dir),
            config=owner.config,
            notes=owner.command,
            mode=mode,
            resume="allow" if record else None,
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        return cls(run, {"id": run_id, "project": owner.project}, dict(logged))

    def log(self, values: dict[str, float], step: int) -> None:
        fresh = {k: v for k, v in values.items() if step > self.logged.get(k, -1)}
        if fresh:
            self.run.log(fresh, step=step)

    def summary(self, values: dict[str, float], step: int) -> None:
        self.run.summary.update({f"final/{k}": v for k, v in values.items()})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class Mlflow:
    """A run in an MLflow store: params (the flattened config), metrics, the command as a tag."""

    name = "mlflow"

    def __init__(self, client: Any, run_id: str, record: dict, logged: dict[str, int]):
        self.client, self.run_id, self.record, self.logged = client, run_id, record, logged

    @classmethod
    def start(cls, owner: Trackers, record: dict | None, resume_step: int | None, logged: dict):
        from mlflow.tracking import MlflowClient

        # Creating a SQLite store logs each migration at INFO; that is not the run's news.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        uri = (record or {}).get("tracking_uri") or _mlflow_uri(owner)
        client = MlflowClient(tracking_uri=uri)
        if record:
            run_id = record["run_id"]
            client.update_run(run_id, status="RUNNING")
            client.set_tag(run_id, f"gpt1.command.resume_at_{resume_step}", owner.command)
            held = {k: _last_step(client, run_id, k) for k in client.get_run(run_id).data.metrics}
            return cls(client, run_id, record, held)
        run_id = _new_mlflow_run(client, owner, uri)
        return cls(client, run_id, {"run_id": run_id, "tracking_uri": uri}, {})

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        fresh = [
            Metric(k, v, now, step) for k, v in values.items() if step > self.logged.get(k, -1)
        ]
        if fresh:
            self.client.log_batch(self.run_id, metrics=fresh)

    def summary(self, values: dict[str, float], step: int) -> None:
        self.log({f"final_{k}": v for k, v in values.items()}, step)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


_KINDS: dict[str, Any] = {"tensorboard": TensorBoard, "wandb": Wandb, "mlflow": Mlflow}


# ---------------------------------------------------------------------------- helpers
def _read_records(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{file}: unreadable ({exc}); it says which tracker runs to continue"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a JSON object of tracker runs")
    return data


def _wandb_mode() -> str:
    """WANDB_MODE when set; online when an API key is configured; offline otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    import netrc

    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].rstrip("/")
    try:
        return "online" if netrc.netrc().authenticators(host) else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


def _mlflow_uri(owner: Trackers) -> str:
    """train.mlflow_uri, else MLFLOW_TRACKING_URI, else a SQLite store in the run folder."""
    if owner.mlflow_uri:
        return owner.mlflow_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(owner.run_dir / 'mlflow.db').resolve()}"


def _new_mlflow_run(client: Any, owner: Trackers, uri: str) -> str:
    from mlflow.entities import Param

    experiment = client.get_experiment_by_name(owner.project)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        local = uri.startswith("sqlite:///") and uri.endswith(
            str(owner.run_dir.resolve() / "mlflow.db")
        )
        where = (owner.run_dir / "mlartifacts").resolve().as_uri() if local else None
        experiment_id = client.create_experiment(owner.project, artifact_location=where)
    run = client.create_run(
        experiment_id,
        run_name=owner.run_dir.name,
        tags={"gpt1.command": owner.command, "mlflow.note.content": owner.command},
    )
    run_id = run.info.run_id
    params = [Param(k, str(v)[:6000]) for k, v in flatten(owner.config).items()]
    for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=params[start : start + 100])
    # No artifacts: with a store of the user's, MLflow would put them beside the current folder.
    return run_id


def _last_step(client: Any, run_id: str, key: str) -> int:
    return max((m.step for m in client.get_metric_history(run_id, key)), default=-1)


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's figures (everything numeric but the step)."""
    return {k: float(v) for k, v in record.items() if k != "step" and _is_number(v)}


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
