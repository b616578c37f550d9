"""Every file gpt1 reads, mutated, is loaded or refused in one line naming it: config.json,
task.json, trainer_state.json, run.json, metrics.jsonl, a prepared corpus's meta.json and token
shards, the tokenizer's vocab.json and merges.txt, model.safetensors (its header's JSON and its
tensors' types and shapes) and CSV/TSV/JSONL task data. Each mutation is structure-aware where
the format has a structure (a JSON value replaced by one of another type, a huge or non-finite
number, a deep nesting; a key dropped; a tensor retyped or reshaped) or byte-level
(`helpers.faults.mutate`); the loader must answer within a time bound with the file loaded or a
`Gpt1Error` whose message is one line naming the file. `make fuzz` runs the full count."""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpt1.errors import Gpt1Error
from helpers import faults
from helpers.fuzzing import budget, report
from helpers.tiny import char_vocab, make_corpus, make_task, run_cli, tiny_finetune

pytestmark = pytest.mark.fuzz

# Placeholders dumped as JSON strings, then swapped for what `json.dumps` cannot write.
HUGE_INT, DEEP = "\x00huge-int", "\x00deep"
RAW = {json.dumps(HUGE_INT): "1" + "0" * 5000, json.dumps(DEEP): "[" * 50_000 + "]" * 50_000}
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 2**63, 10**400, 1e308, -1e308, 5e-324, HUGE_INT, DEEP, "x" * 70_000])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
ACTIONS = ("set", "set", "set", "drop", "wrap", "stringify", "root")


def dumps(obj: Any) -> bytes:
    text = json.dumps(obj)
    for placeholder, raw in RAW.items():
        text = text.replace(placeholder, raw)
    return text.encode()


def _slots(obj: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value inside `obj`, depth first."""
    out = []
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for key, value in items:
        out.append((obj, key))
        out.extend(_slots(value))
    return out


def mutate_json(obj: Any, pick: int, action: str, value: Any) -> Any:
    """`obj` with one value changed: replaced by `value`, dropped, wrapped in a list or turned
    into its string; `root` replaces the whole document."""
    obj = copy.deepcopy(obj)
    slots = _slots(obj)
    if action == "root" or not slots:
        return value
    container, key = slots[pick % len(slots)]
    if action == "drop":
        del container[key]
    elif action == "wrap":
        container[key] = [container[key]]
    elif action == "stringify":
        container[key] = str(container[key])
    else:
        container[key] = value
    return obj


# A structure-aware JSON mutation or a byte-level one (`helpers.faults.mutate`).
JSON_MUTATION = st.tuples(st.integers(0, 10_000), st.sampled_from(ACTIONS), VALUES)
BYTE_MUTATION = st.tuples(
    st.sampled_from(faults.OPS + faults.LINE_OPS),
    st.floats(0, 1, exclude_max=True),
    st.integers(0, 10_000),
    st.binary(min_size=1, max_size=16),
)
LINE_MUTATION = st.tuples(st.just("bytes"), BYTE_MUTATION)
MUTATION = st.one_of(
    st.tuples(st.just("json"), JSON_MUTATION),
    st.tuples(st.just("bytes"), BYTE_MUTATION),
)
SAFETENSORS_MUTATION = st.one_of(
    MUTATION,
    st.tuples(
        st.just("tensor"),
        st.tuples(
            st.integers(0, 10_000),
            st.sampled_from(["int32", "int64", "uint8", "bool", "float64", "float16", "bfloat16"]),
            st.sampled_from(["retype", "reshape", "drop", "scalar"]),
        ),
    ),
    st.tuples(
        st.just("header"),
        st.tuples(
            st.integers(0, 10_000),
            st.sampled_from(["dtype", "shape", "data_offsets"]),
            st.sampled_from(
                ["F32", "F16", "BF16", "I32", "U8", "BOOL", "F64", "F8_E4M3", "", "X", None, 7]
            )
            | st.lists(st.integers(-(2**64), 2**64), max_size=3),
        ),
    ),
)


def mutate_jsonl(data: bytes, pick: int, action: str, value: Any) -> bytes:
    """One line of a JSON Lines file, mutated as `mutate_json` does."""
    lines = data.split(b"\n")
    full = [i for i, line in enumerate(lines) if line.strip()]
    i = full[pick % len(full)]
    lines[i] = dumps(mutate_json(json.loads(lines[i]), pick // len(full), action, value))
    return b"\n".join(lines)


def mutate_safetensors(data: bytes, kind: str, args: tuple) -> bytes:
    """The weights file with its header JSON or one of its tensors changed."""
    import torch
    from safetensors.torch import load, save

    if kind == "tensor":
        pick, dtype, how = args
        state = load(data)
        name = sorted(state)[pick % len(state)]
        tensor = state[name]
        if how == "drop":
            del state[name]
        elif how == "scalar":
            state[name] = tensor.flatten()[:1].reshape(())
        elif how == "reshape":
            state[name] = tensor.reshape(-1) if tensor.dim() > 1 else tensor[:-1].contiguous()
        else:
            state[name] = tensor.to(getattr(torch, dtype))
        return save(state)
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    if kind == "header":
        pick, field, value = args
        names = sorted(k for k in header if k != "__metadata__")
        header[names[pick % len(names)]][field] = value
    else:
        header = mutate_json(header, *args)
    raw = dumps(header)
    return struct.pack("<Q", len(raw)) + raw + data[8 + size :]


# ------------------------------------------------------------------------------- the formats
def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}


def _resume(folder: Path) -> None:
    """`gpt1 finetune --resume auto` of the fine-tuned run in `folder`, one step on."""
    code, err = run_cli(
        tiny_finetune(folder / "task", folder / "vocab", folder / "ft", 3, "--resume", "auto")
    )
    if code == 2:
        raise Gpt1Error(err)
    assert code == 0, err


def _metrics(folder: Path) -> None:
    from gpt1.train.telemetry import history, plot_run, truncate_after

    file = folder / "ft" / "metrics.jsonl"
    try:
        plot_run(folder / "ft")
    finally:  # a resume reads the file too (passing over damaged lines): before it is cut back
        history(file, 1)
        truncate_after(file, 1)


def _run_json(folder: Path) -> None:
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.train import resume

    final = folder / "ft" / "final"
    open_checkpoint(final)
    resume.run_record({}, final, folder / "ft" / "run.json", {})


def _task_data(kind: str, skip: bool) -> Callable[[Path], object]:
    def read(folder: Path) -> object:
        from gpt1.tasks.registry import get_task

        spec = {"columns": {"text": "text", "label": "label"}, "labels": ["neg", "pos"]}
        return get_task(kind, spec).read(folder, "dev", skip)

    return read


def _finetuned(folder: Path) -> None:
    from gpt1.inference.loading import task_of
    from gpt1.recipes.evaluate import load_finetuned

    _, record, _ = load_finetuned(folder / "ft" / "final")
    task_of(record)


@pytest.fixture(scope="module")
def formats(
    tmp_path_factory,
) -> tuple[dict[str, tuple[faults.Reader, dict[str, bytes], str]], Path]:
    """(name -> (reader, its clean files, how the target is mutated: json, jsonl, safetensors
    or lines), the folder every case is written to). That folder is where the fine-tuned run
    was made: a resume must name the paths the run recorded."""
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.model.finetuned import load_finetuned_model
    from gpt1.text.shards import read_shard
    from gpt1.text.tokenizer import Tokenizer
    from gpt1.text.windows import open_prepared

    work = tmp_path_factory.mktemp("formats")
    src = work / "src"
    task, vocab = make_task(src / "task"), char_vocab(src / "vocab")
    code, err = run_cli(tiny_finetune(task, vocab, src / "ft", 2, "--save-every", "1"))
    assert code == 0, err
    run = _files(src)
    corpus = _files(make_corpus(work / "corpus", n_train=600, n_val=100))
    tok = work / "tok"
    char_vocab(tok)
    pieces = json.loads((tok / "vocab.json").read_text())
    pieces.update({"th": len(pieces), "the</w>": len(pieces) + 1})
    (tok / "vocab.json").write_text(json.dumps(pieces))
    (tok / "merges.txt").write_text("#version: 0.2\nt h\nth e</w>\n")
    tables = work / "tables"
    tables.mkdir()
    rows = [('good film, "fine"', "pos"), ("bad film", "neg")] * 4
    (tables / "dev.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    (tables / "dev.csv").write_text(
        "text,label\n" + "".join(f"{json.dumps(t)},{l}\n" for t, l in rows)
    )
    (tables / "dev.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": l}) + "\n" for t, l in rows)
    )

    def final(f: Path) -> Any:
        return load_finetuned_model(open_checkpoint(f / "ft" / "final"))

    table = [
        ("config.json", run, "ft/final/config.json", final, "json"),
        ("task.json", run, "ft/final/task.json", _finetuned, "json"),
        ("trainer_state.json", run, "ft/final/trainer_state.json", _resume, "json"),
        ("run.json", run, "ft/run.json", _run_json, "json"),
        ("metrics.jsonl", run, "ft/metrics.jsonl", _metrics, "jsonl"),
        ("meta.json", corpus, "meta.json", open_prepared, "json"),
        (
            "token shard",
            corpus,
            "train-00000.bin",
            lambda f: (open_prepared(f), read_shard(f / "train-00000.bin")),
            "lines",
        ),
        ("vocab.json", _files(tok), "vocab.json", Tokenizer.from_dir, "json"),
        ("merges.txt", _files(tok), "merges.txt", Tokenizer.from_dir, "lines"),
        ("model.safetensors", run, "ft/final/model.safetensors", final, "safetensors"),
        ("head.safetensors", run, "ft/final/head.safetensors", final, "safetensors"),
    ]
    for ext in ("csv", "tsv", "jsonl"):
        for skip in (False, True):
            name = f"dev.{ext}" + (" --skip-bad-rows" if skip else "")
            how = "jsonl" if ext == "jsonl" else "lines"
            table.append(
                (
                    name,
                    {f"dev.{ext}": tables / f"dev.{ext}"},
                    f"dev.{ext}",
                    _task_data(ext, skip),
                    how,
                )
            )
    out = {}
    for name, files, target, read, how in table:
        reader = faults.Reader(name, files, target, read, head=0)
        out[name] = (reader, faults.stage(reader, work / "stage"), how)
    return out, src


FORMATS = [
    "config.json",
    "task.json",
    "trainer_state.json",
    "run.json",
    "metrics.jsonl",
    "meta.json",
    "token shard",
    "vocab.json",
    "merges.txt",
    "model.safetensors",
    "head.safetensors",
    *(f"dev.{ext}{skip}" for ext in ("csv", "tsv", "jsonl") for skip in ("", " --skip-bad-rows")),
]
# Each format's cases: a slice in `make test`, at least 200 under `make fuzz`. Resuming a
# fine-tuning run and drawing plots take a second each: fewer of those in the slice.
SLOW = {"trainer_state.json": 3, "metrics.jsonl": 6}
TRIED: dict[str, list[int]] = {}


def mutated(data: bytes, how: str, mutation: tuple[str, tuple]) -> bytes:
    kind, args = mutation
    if kind == "bytes":
        return faults.mutate(data, *args)
    if how == "json":
        return dumps(mutate_json(json.loads(data), *args))
    if how == "jsonl":
        return mutate_jsonl(data, *args)
    return mutate_safetensors(data, kind, args)


def check(name: str, formats: dict, case: Path, mutation: tuple[str, tuple]) -> None:
    reader, clean, how = formats[name]
    files = dict(clean)
    files[reader.target] = mutated(clean[reader.target], how, mutation)
    refusals: list[Gpt1Error] = []
    outcome = faults.try_input(reader, case, files, seconds=60, refusals=refusals)
    counts = TRIED.setdefault(name, [0, 0])
    counts[outcome == "error"] += 1
    if refusals:
        message = str(refusals[0])
        assert "\n" not in message.strip(), f"{name}: a multi-line error: {message!r}"
        assert Path(reader.target).name in message, f"{name}: {message!r} names not the file"


@pytest.mark.parametrize("name", FORMATS)
def test_mutated_file_is_loaded_or_refused_in_one_line_naming_it(formats, name):
    table, case = formats
    how = table[name][2]
    strategy = {"safetensors": SAFETENSORS_MUTATION, "lines": LINE_MUTATION}.get(how, MUTATION)

    @settings(
        max_examples=budget(SLOW.get(name, 12), 200),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutation=strategy)
    def run(mutation):
        check(name, table, case, mutation)

    TRIED.pop(name, None)
    run()
    loaded, refused = TRIED[name]
    report(f"files {name}", tried=loaded + refused, loaded=loaded, refused=refused, tracebacks=0)


def test_every_format_unmutated_loads(formats):
    table, case = formats
    assert sorted(table) == sorted(FORMATS)
    for name in FORMATS:
        reader, clean, _ = table[name]
        assert faults.try_input(reader, case, clean) == "ok", name
