"""Fault injection for the tests and the fault report (benchmarks/faults.py).

Three families, each a plain function that `tests/` and `benchmarks/faults.py` import:

* kill loops (`pretrain_faults`, `finetune_faults`): SIGKILL `gpt1 pretrain`/`finetune` again and
  again at random moments -- a third aimed at the instant a checkpoint is being written -- resuming
  each time with `--resume auto`; after every kill every checkpoint on disk is verified, and the
  end result is compared bitwise with an uninterrupted run;
* reader fuzzing (`readers`, `mutate`, `try_input`, `fuzz_readers`): mutated copies of real
  dataset files must parse or raise a `Gpt1Error` within a time limit;
* fault cases (`CASES`, `run_cases` in `helpers.fault_cases`): one function per fault a user's
  disk or a second process can throw at a command, each returning a `CaseResult`.

The tiny inputs they run on (corpus, vocabulary, task, command lines) are `helpers.tiny`'s.
Nothing here knows where real data lives: callers pass the folder (`readers(shared, work)`).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpt1.errors import Gpt1Error
from helpers.tiny import (
    char_vocab,
    gpt1_process,
    make_corpus,
    make_task,
    subprocess_env,
    tiny_finetune,
    tiny_pretrain,
)


def pretrain_cmd(data: Path, out: Path, steps: int) -> list[str]:
    """The kill loop's pretraining subprocess: a checkpoint and a metrics line every step."""
    extra = ("--eval-every", "5", "--log-every", "1", "--set", "train.keep_last=2")
    return gpt1_process(*tiny_pretrain(data, out, steps, *extra))


def finetune_cmd(task: Path, vocab: Path, out: Path, steps: int) -> list[str]:
    """The kill loop's fine-tuning subprocess: a checkpoint every step, every step logged."""
    extra = ("--save-every", "1", "--eval-every", "4", "--set", "train.keep_last=2")
    extra += ("--set", "train.log_every=1")
    return gpt1_process(*tiny_finetune(task, vocab, out, steps, *extra))


# ============================================================================== kill loops
@dataclass
class KillReport:
    """What a kill loop did and what it cost."""

    command: str
    kills: int = 0  # SIGKILLs delivered to a running process
    kills_in_write: int = 0  # ... of which landed while a checkpoint folder was half written
    resumes: int = 0  # restarts with --resume auto (each from an intact checkpoint)
    checkpoints_verified: int = 0  # checkpoint folders fully loaded and checked after kills
    steps_redone: int = 0  # logged steps past the newest checkpoint at a kill (recomputed)
    data_lost: int = 0  # damaged/vanished checkpoints + differences from the reference
    problems: list[str] = field(default_factory=list)

    def lose(self, what: str) -> None:
        self.data_lost += 1
        self.problems.append(what)


def verify_run(run: Path) -> tuple[int, list[str]]:
    """Load every published checkpoint of `run`; (count verified, problems found)."""
    from gpt1.model.checkpoint import load_checkpoint
    from gpt1.train.state import load_training_state

    count, problems = 0, []
    for folder in sorted(
        p
        for p in run.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and (p.name.startswith("step-") or p.name == "final")
    ):
        try:
            load_checkpoint(folder)
            _, meta = load_training_state(folder)
            if folder.name.startswith("step-") and meta["step"] != int(folder.name[5:]):
                raise ValueError(f"trainer state says step {meta['step']}")
            count += 1
        except Exception as exc:  # noqa: BLE001 - any failure is a damaged checkpoint
            problems.append(f"{folder.name}: {type(exc).__name__}: {exc}")
    return count, problems


def newest_step(run: Path) -> int:
    from gpt1.train.state import latest_resumable, read_trainer_json

    last = latest_resumable(run) if run.is_dir() else None
    return read_trainer_json(last)["step"] if last else 0


def logged_steps(run: Path) -> int:
    file = run / "metrics.jsonl"
    if not file.is_file():
        return 0
    steps = []
    for line in file.read_text().splitlines():
        try:
            steps.append(json.loads(line).get("step", 0))
        except json.JSONDecodeError:
            pass
    return max(steps, default=0)


def _wait_for_write(run: Path, proc: subprocess.Popen, deadline: float) -> bool:
    """Poll until a checkpoint's temporary folder exists (a write in progress)."""
    while time.time() < deadline and proc.poll() is None:
        if (
            any(
                p.name.startswith((".step-", ".final.")) and ".tmp-" in p.name
                for p in run.iterdir()
            )
            if run.is_dir()
            else False
        ):
            return True
        time.sleep(0.0005)
    return False


def kill_loop(
    cmd: list[str],
    run: Path,
    kills: int,
    rng: random.Random,
    span: float,
    name: str,
    steps: int,
    timeout: float = 300,
) -> KillReport:
    """SIGKILL `cmd` (which must include `--resume auto`) `kills` times, then let it finish.

    Kills cycle through three kinds of moment: uniform in `span` (the wall time of an
    uninterrupted run, shrunk to the work left; start-up included); the instant a checkpoint's temporary folder appears
    (a write in progress); a random instant shortly after a random step past the newest
    checkpoint (1-3 steps on, of `steps`) was logged.
    """
    report = KillReport(name)
    for k in range(kills):
        before = newest_step(run)
        proc = subprocess.Popen(
            cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        mode = (k + 2) % 3  # start with a step-aimed kill: it cannot miss the run
        aimed = mode == 1
        if mode == 0:  # a random moment of the whole run, start-up included
            # 0.6: a resumed run may be faster than the timed one (warm caches, less load)
            end = time.time() + rng.uniform(0.1, 0.6 * span * (steps - before) / steps)
            while time.time() < end and proc.poll() is None:
                time.sleep(0.005)
        elif mode == 1:  # the instant a checkpoint folder is being written
            _wait_for_write(run, proc, time.time() + timeout)
        else:  # a random moment within a random training step
            target = min(before + rng.randint(1, 3), steps - 1)
            end = time.time() + timeout
            while logged_steps(run) < target and proc.poll() is None and time.time() < end:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.05))
        if proc.poll() is not None:  # finished (or failed) before the kill
            err = proc.stderr.read().decode(errors="replace")
            proc.wait()
            if proc.returncode != 0:
                report.lose(f"{name}: run failed with {proc.returncode}: {err[-300:]}")
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        report.kills += 1
        tmp = [p for p in run.iterdir() if ".tmp-" in p.name and p.is_dir()] if run.is_dir() else []
        report.kills_in_write += int(aimed and any(str(proc.pid) in p.name for p in tmp))
        count, problems = verify_run(run) if run.is_dir() else (0, [])
        report.checkpoints_verified += count
        for p in problems:
            report.lose(f"after kill {k + 1}: {p}")
        after = newest_step(run)
        if after < before:
            report.lose(f"after kill {k + 1}: newest checkpoint went back from {before} to {after}")
        report.steps_redone += max(0, logged_steps(run) - after)
        report.resumes += 1
    done = subprocess.run(
        cmd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        report.lose(f"{name}: final resume failed ({done.returncode}): {done.stderr[-400:]}")
    count, problems = verify_run(run)
    report.checkpoints_verified += count
    for p in problems:
        report.lose(f"at the end: {p}")
    return report


def compare_runs(
    ref: Path, run: Path, report: KillReport, extra_files: tuple[str, ...] = ()
) -> None:
    """Every metrics line and the final weights (and `extra_files`) must equal the reference."""
    import torch
    from safetensors.torch import load_file

    def lines(r: Path) -> list[dict]:
        out = [json.loads(l) for l in (r / "metrics.jsonl").read_text().splitlines()]
        for rec in out:  # timing fields differ between any two runs
            for key in ("tokens_per_s", "mfu", "mem_gb"):
                rec.pop(key, None)
        return out

    a, b = lines(ref), lines(run)
    if a != b:
        diff = [(x, y) for x, y in zip(a, b) if x != y]
        first = diff[0] if diff else (len(a), len(b))
        report.lose(
            f"metrics.jsonl: {len(diff)} lines differ from the uninterrupted run "
            f"({len(a)} vs {len(b)} lines); first: {first}"
        )
    for weights in ("model.safetensors", "head.safetensors"):
        fa, fb = ref / "final" / weights, run / "final" / weights
        if not fa.is_file():
            continue
        ta, tb = load_file(str(fa)), load_file(str(fb)) if fb.is_file() else {}
        if set(ta) != set(tb) or not all(torch.equal(ta[k], tb[k]) for k in ta):
            report.lose(f"final/{weights} differs from the uninterrupted run")
    for name in extra_files:
        if (ref / name).read_text() != (run / name).read_text():
            report.lose(f"{name} differs from the uninterrupted run")


def timed_run(cmd: list[str], timeout: float = 300) -> float:
    t0 = time.time()
    subprocess.run(cmd, env=subprocess_env(), check=True, capture_output=True, timeout=timeout)
    return time.time() - t0


def pretrain_faults(work: Path, kills: int, seed: int, steps: int = 30) -> KillReport:
    steps = max(steps, 2 * kills)  # room for every kill to land inside the run
    data = make_corpus(work / "data")
    ref, run = work / "pre-ref", work / "pre-kill"
    span = timed_run(pretrain_cmd(data, ref, steps))
    report = kill_loop(
        pretrain_cmd(data, run, steps) + ["--resume", "auto"],
        run,
        kills,
        random.Random(seed),
        span,
        "pretrain",
        steps,
    )
    compare_runs(ref, run, report)
    return report


def finetune_faults(work: Path, kills: int, seed: int, steps: int = 16) -> KillReport:
    steps = max(steps, 2 * kills)  # room for every kill to land inside the run
    task, vocab = make_task(work / "task"), char_vocab(work / "vocab")
    ref, run = work / "ft-ref", work / "ft-kill"
    span = timed_run(finetune_cmd(task, vocab, ref, steps))
    report = kill_loop(
        finetune_cmd(task, vocab, run, steps) + ["--resume", "auto"],
        run,
        kills,
        random.Random(seed),
        span,
        "finetune",
        steps,
    )
    compare_runs(ref, run, report, extra_files=("results.json",))
    return report


# ============================================================================ hostile files
def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def mutate(data: bytes, op: str, pos: float, size: int, fill: bytes) -> bytes:
    """One damage to a file: `pos` in [0, 1) picks where, `size` how much, `fill` what with."""
    lines = _lines(data)
    i = int(pos * len(lines)) % max(1, len(lines))
    if op == "empty":
        return b""
    if op == "truncate_file":
        return data[: int(pos * len(data))]
    if op == "truncate_line":
        lines[i] = lines[i][: int(size) % (len(lines[i]) + 1)]
    elif op == "drop_field":
        for sep in (b"\t", b","):
            if sep in lines[i]:
                parts = lines[i].split(sep)
                del parts[size % len(parts)]
                lines[i] = sep.join(parts)
                break
    elif op == "extra_field":
        lines[i] += (b"\t" if b"\t" in data else b",") + fill
    elif op == "huge_field":
        lines[i] += b"x" * (200_000 + size)
    elif op == "latin1":
        return data.decode("utf-8", "replace").encode("latin-1", "replace") + "\u00e9".encode(
            "latin-1"
        )
    elif op == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    elif op == "bytes":
        at = int(pos * len(data))
        return data[:at] + fill + data[at + len(fill) :]
    elif op == "duplicate_line":
        lines.insert(i, lines[i])
    elif op == "blank_lines":
        lines[i:i] = [b""] * (size % 5 + 1)
    elif op == "quote":
        lines[i] = b'"' + lines[i]
    elif op == "crlf":
        return data.replace(b"\n", b"\r\n")
    elif op == "nul":
        lines[i] += b"\0" * (size % 7 + 1)
    elif op == "deep_nesting":  # JSON nested past Python's recursion limit
        lines[i] = b"[" * (100_000 + size) + b"]" * (100_000 + size)
    elif op == "nonfinite":  # numbers that parse as floats but poison a loss
        lines[i] = lines[i].replace(b"1", b"inf", 1).replace(b"0", b"nan", 1)
    elif op == "bom":  # a UTF-8 byte-order mark, as a Windows editor saves it
        return b"\xef\xbb\xbf" + data
    elif op == "lone_cr":  # a spreadsheet's "CSV (Macintosh)"
        return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r")
    elif op == "stray_cr":
        at = int(size) % (len(lines[i]) + 1)
        lines[i] = lines[i][:at] + b"\r" + lines[i][at:]
    return b"\n".join(lines)


OPS = (
    "empty",
    "truncate_file",
    "truncate_line",
    "drop_field",
    "extra_field",
    "huge_field",
    "latin1",
    "utf16",
    "bytes",
    "duplicate_line",
    "blank_lines",
    "quote",
    "crlf",
    "nul",
    "deep_nesting",
    "nonfinite",
)
# Line-ending damage (tests/test_fuzz_files.py): not in OPS, which the readers of real files take.
LINE_OPS = ("bom", "lone_cr", "stray_cr")


@dataclass
class Reader:
    """A dataset reader under test: `files` are copied (first `head` lines) into a fresh folder
    and one of them (`target`) is mutated; `read(folder)` runs the reader on it."""

    name: str
    files: dict[str, Path]  # name in the folder -> real source file
    target: str  # which of them gets damaged
    read: Callable[[Path], object]
    head: int = 60


def _task_read(
    task: str, split: str, spec: dict | None = None, file: str | None = None, skip: bool = False
) -> Callable[[Path], object]:
    from gpt1.tasks.registry import get_task

    def read(folder: Path) -> object:
        t = get_task(task, spec)
        return t.read(folder / file if file else folder, split, skip)

    return read


def _race_json() -> bytes:
    obj = {
        "id": "middle1.txt",
        "article": "Tom went to the market. He bought apples.",
        "questions": ["Where did Tom go?", "What did he buy?"],
        "options": [
            ["home", "school", "the market", "the park"],
            ["pears", "apples", "milk", "bread"],
        ],
        "answers": ["C", "B"],
    }
    return json.dumps(obj).encode()


def _dpr_text() -> bytes:
    return (
        b"The bee landed on the flower because it had pollen.\nit\nThe bee,the flower\n"
        b"the flower\n\nJohn thanked Bill because he had helped him.\nhe\nJohn,Bill\nBill\n"
    )


def _race_jsonl() -> bytes:
    rows = (
        {
            "article": "A short story.",
            "question": f"Q{i}?",
            "options": ["a", "b", "c", "d"],
            "answer": "ABCD"[i % 4],
        }
        for i in range(8)
    )
    return b"\n".join(json.dumps(row).encode() for row in rows) + b"\n"


def _synthetic_files(folder: Path) -> Path:
    """Files for the readers whose data the shared folder lacks (RACE, DPR, a prepared corpus)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "middle1.txt").write_bytes(_race_json())
    (folder / "race.jsonl").write_bytes(_race_jsonl())
    (folder / "dpr.txt").write_bytes(_dpr_text())
    make_corpus(folder / "corpus")
    return folder


# Column specs for the generic readers, over the real files they are fuzzed with.
GENERIC_TSV = {"columns": {"text": "sentence", "label": "label"}, "labels": ["0", "1"]}
GENERIC_JSONL = {
    "columns": {"a": "sentence1", "b": "sentence2", "label": "gold_label"},
    "labels": ["E", "N"],
}
GENERIC_CSV = {
    "columns": {
        "context": "InputSentence1",
        "choices": "RandomFifthSentenceQuiz1|RandomFifthSentenceQuiz2",
        "label": "AnswerRightEnding",
    },
    "labels": ["1", "2"],
    "kind": "choice",
}


def _task_readers(shared: Path, synth: Path) -> list[Reader]:
    """The task readers (GLUE, NLI, story cloze, RACE and the generic formats)."""
    g, k = shared / "glue", shared / "glue_kshot_samples"
    sst2, scitail = g / "SST-2" / "dev.tsv", shared / "scitail" / "dev" / "answers.jsonl"
    sc = shared / "story_cloze" / "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
    snli = {f"{p}.dev": shared / "snli" / f"{p}.dev" for p in ("s1", "s2", "labels")}
    return [
        Reader(
            "cola",
            {"train.tsv": g / "CoLA" / "train.tsv"},
            "train.tsv",
            _task_read("cola", "train"),
        ),
        Reader("sst2", {"dev.tsv": sst2}, "dev.tsv", _task_read("sst2", "dev")),
        Reader("stsb", {"dev.tsv": g / "STS-B" / "dev.tsv"}, "dev.tsv", _task_read("stsb", "dev")),
        Reader("qnli", {"dev.tsv": g / "QNLI" / "dev.tsv"}, "dev.tsv", _task_read("qnli", "dev")),
        Reader(
            "mnli (GLUE tsv)",
            {"dev_matched.tsv": k / "MNLI" / "16-42" / "dev_matched.tsv"},
            "dev_matched.tsv",
            _task_read("mnli", "dev_matched"),
        ),
        Reader(
            "qqp", {"dev.tsv": k / "QQP" / "16-42" / "dev.tsv"}, "dev.tsv", _task_read("qqp", "dev")
        ),
        Reader("snli (parallel lines)", snli, "s2.dev", _task_read("snli", "dev")),
        Reader(
            "snli (textfooler)",
            {"snli": shared / "nli_samples_textfooler" / "snli"},
            "snli",
            _task_read("snli", "test", file="snli"),
        ),
        Reader(
            "scitail (jsonl)", {"dev.jsonl": scitail}, "dev.jsonl", _task_read("scitail", "dev")
        ),
        Reader(
            "story_cloze (csv)",
            {"val.csv": sc},
            "val.csv",
            _task_read("story_cloze", "test", file="val.csv"),
        ),
        Reader(
            "race (json folder, synthetic)",
            {"dev/middle/1.txt": synth / "middle1.txt"},
            "dev/middle/1.txt",
            _task_read("race", "dev"),
        ),
        Reader(
            "race (jsonl, synthetic)",
            {"dev.jsonl": synth / "race.jsonl"},
            "dev.jsonl",
            _task_read("race", "dev"),
        ),
        Reader("generic tsv", {"dev.tsv": sst2}, "dev.tsv", _task_read("tsv", "dev", GENERIC_TSV)),
        Reader(
            "generic jsonl",
            {"dev.jsonl": scitail},
            "dev.jsonl",
            _task_read("jsonl", "dev", GENERIC_JSONL),
        ),
        Reader(
            "generic csv (choices)",
            {"dev.csv": sc},
            "dev.csv",
            _task_read("csv", "dev", GENERIC_CSV),
        ),
        Reader(
            "skip-bad-rows sst2", {"dev.tsv": sst2}, "dev.tsv", _task_read("sst2", "dev", skip=True)
        ),
    ]


def _file_readers(shared: Path, synth: Path) -> list[Reader]:
    """The readers of zero-shot data, token shards, prepared folders and tokenizer files."""
    from gpt1.text.shards import read_shard
    from gpt1.text.tokenizer import Tokenizer
    from gpt1.text.windows import open_prepared
    from gpt1.zeroshot.data import read_dpr, read_lambada

    corpus, bpe = synth / "corpus", shared / "gpt1_tokenizer"
    lambada = shared / "corpus" / "lambada" / "lambada_test_plain_text.txt"
    prepared = ("meta.json", "train-00000.bin", "train-00001.bin", "val-00000.bin")
    tokenizer = ("encoder_bpe_40000.json", "vocab_40000.bpe")
    return [
        Reader(
            "lambada", {"l.txt": lambada}, "l.txt", lambda f: read_lambada(f / "l.txt"), head=20
        ),
        Reader(
            "dpr (synthetic)",
            {"dpr.txt": synth / "dpr.txt"},
            "dpr.txt",
            lambda f: read_dpr(f / "dpr.txt"),
        ),
        Reader(
            "token shard",
            {"train-00000.bin": corpus / "train-00000.bin"},
            "train-00000.bin",
            lambda f: read_shard(f / "train-00000.bin"),
            head=0,
        ),
        Reader(
            "prepared meta.json",
            {n: corpus / n for n in prepared},
            "meta.json",
            open_prepared,
            head=0,
        ),
        Reader(
            "tokenizer files",
            {n: bpe / n for n in tokenizer},
            "vocab_40000.bpe",
            Tokenizer.from_dir,
            head=0,
        ),
    ]


def readers(shared: Path, work: Path) -> list[Reader]:
    """Every dataset reader with a real file from the data folder `shared` (synthetic where none
    exists)."""
    synth = _synthetic_files(work / "synthetic")
    return _task_readers(shared, synth) + _file_readers(shared, synth)


def stage(reader: Reader, folder: Path) -> dict[str, bytes]:
    """The reader's source files, shortened to `head` lines (0 = whole file)."""
    out = {}
    for name, src in reader.files.items():
        data = src.read_bytes()
        if reader.head:
            data = b"\n".join(data.split(b"\n")[: reader.head + 1]) + b"\n"
        out[name] = data
    return out


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def try_input(
    reader: Reader,
    folder: Path,
    files: dict[str, bytes],
    seconds: float = 20,
    refusals: list[Gpt1Error] | None = None,
) -> str:
    """Write `files` into a fresh `folder`, run the reader: "ok", "error" (a Gpt1Error, appended
    to `refusals` when given), or raise AssertionError for anything else (another exception
    type, or a hang past `seconds`)."""
    if folder.exists():
        shutil.rmtree(folder)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        reader.read(folder)
        return "ok"
    except Gpt1Error as exc:
        if refusals is not None:
            refusals.append(exc)
        return "error"
    except Hang:
        raise AssertionError(f"{reader.name}: no answer within {seconds}s (hang)") from None
    except Exception as exc:  # noqa: BLE001 - the point: anything else is a bug
        raise AssertionError(f"{reader.name}: {type(exc).__name__}: {exc}") from exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fuzz_readers(
    shared: Path, work: Path, inputs: int, seed: int
) -> list[tuple[str, int, int, int, list[str]]]:
    """(reader, inputs tried, parsed, clean errors, failures) for every reader."""
    rng = random.Random(seed)
    rows = []
    for reader in readers(shared, work):
        clean = stage(reader, work / "src")
        ok = err = 0
        failures: list[str] = []
        for _ in range(inputs):
            op = rng.choice(OPS)
            fill = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
            files = dict(clean)
            files[reader.target] = mutate(
                clean[reader.target], op, rng.random(), rng.randrange(1000), fill
            )
            try:
                if try_input(reader, work / "case", files) == "ok":
                    ok += 1
                else:
                    err += 1
            except AssertionError as exc:
                failures.append(f"{op}: {exc}")
        rows.append((reader.name, inputs, ok, err, failures))
    return rows
