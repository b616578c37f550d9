"""Pretraining from text files read directly (`gpt1.text.stream`): the same windows as a
sequential pass over `gpt1 prepare`'s shards of the same text, the rank split, exact resume
(also after SIGKILL), and the user errors."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gpt1.cli import main
from gpt1.config import DataConfig
from gpt1.errors import ConfigError, DataError
from gpt1.text.prepare import PrepareOptions, documents, prepare
from gpt1.text.stream import TextWindows, batch_source, open_data
from gpt1.text.windows import SequentialWindows, open_prepared
from helpers import faults
from helpers.tiny import TORCHRUN_TWO_PROCESSES, char_vocab, subprocess_env, tiny_pretrain

WORDS = "the a ship sailed far over grey water and men sang of home while wind rose".split()
N_CTX = 32


def write_corpus(folder: Path, seed: int = 0) -> Path:
    """Two .txt files of paragraphs, a .jsonl and a .parquet file: about 40 short documents."""
    rng = random.Random(seed)

    def doc() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + "."

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("\n\n".join(doc() for _ in range(10)) + "\n")
    rows = [{"text": doc()} for _ in range(10)] + [{"text": "   "}]  # a blank one is skipped
    (folder / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [doc() for _ in range(10)]}), folder / "d.parquet")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(text folder, tokenizer folder, its `gpt1 prepare --val-fraction 0` output)."""
    work = tmp_path_factory.mktemp("stream")
    text, vocab = write_corpus(work / "text"), char_vocab(work / "vocab")
    opts = PrepareOptions(val_fraction=0, doc_sep="blank-line", shard_tokens=700, quiet=True)
    prepare([text], vocab, work / "prepared", opts)
    return text, vocab, work / "prepared"


def stream_of(text: Path, vocab: Path, rank: int = 0, world: int = 1) -> TextWindows:
    data = open_data(DataConfig(path=str(text), tokenizer=str(vocab), doc_sep="blank-line"))
    source = batch_source(data, DataConfig(), N_CTX, 0, rank, world)
    assert isinstance(source, TextWindows)
    return source


def test_text_stream_equals_a_sequential_pass_over_prepared_shards(corpus):
    text, vocab, prepared = corpus
    split = open_prepared(prepared).splits["train"]
    assert len(split.shards) > 2  # windows run across shard boundaries
    shards, stream = SequentialWindows(split, N_CTX), stream_of(text, vocab)
    for micro in [1, 3, 2, 5] * 12:  # well past one pass: the stream starts over
        a, b = shards.next_batch(micro), stream.next_batch(micro)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert stream.state_dict()["epoch"] >= 1
    x, y = b
    assert x.shape == (5, N_CTX) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_windows_are_contiguous_text_in_document_order(corpus):
    text, vocab, prepared = corpus
    data = open_data(DataConfig(path=str(text), tokenizer=str(vocab), doc_sep="blank-line"))
    ids = [
        i
        for f in data.files
        for d in documents(f, data.opts, None)
        for i in data.tokenizer.encode(d)
    ]
    x, y = stream_of(text, vocab).next_batch(4)
    expected = torch.tensor(ids[: 4 * N_CTX + 1])
    assert torch.equal(x.reshape(-1), expected[:-1])  # window g starts at token g * n_ctx
    assert torch.equal(y[-1], expected[-N_CTX:])


def test_ranks_tokenize_alternate_documents(corpus):
    text, vocab, _ = corpus
    data = open_data(DataConfig(path=str(text), tokenizer=str(vocab), doc_sep="blank-line"))
    docs = [d for f in data.files for d in documents(f, data.opts, None)]
    for rank in (0, 1):
        mine = [i for d in docs[rank::2] for i in data.tokenizer.encode(d)]
        x, _ = stream_of(text, vocab, rank, 2).next_batch(3)
        assert x.reshape(-1).tolist() == mine[: 3 * N_CTX]


def test_resume_from_any_cursor_is_exact(corpus):
    text, vocab, _ = corpus
    for rank, world in ((0, 1), (1, 2)):
        reference = stream_of(text, vocab, rank, world)
        offsets = set()
        for _ in range(9):
            state = json.loads(json.dumps(reference.state_dict()))  # what a checkpoint keeps
            offsets.add(state["offset"] > 0)
            resumed = stream_of(text, vocab, rank, world)
            resumed.load_state_dict(state)
            for micro in (5, 3, 6):
                a, b = reference.next_batch(micro), resumed.next_batch(micro)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            assert resumed.state_dict() == reference.state_dict()  # the digests go on alike
        assert reference.state_dict()["epoch"] >= 1  # resumed in a later pass too
        assert offsets == {True, False}  # cursors inside a document and at its start


def test_tokenizing_processes_give_the_same_stream(corpus, monkeypatch):
    import gpt1.text.prepare

    monkeypatch.setattr(gpt1.text.prepare, "TASK_CHARS", 300)  # many small tasks in flight
    text, vocab, _ = corpus
    data = open_data(DataConfig(path=str(text), tokenizer=str(vocab), doc_sep="blank-line"))
    alone, helped = TextWindows(data, N_CTX), TextWindows(data, N_CTX, workers=2)
    for _ in range(30):  # past the end of a pass
        assert torch.equal(alone.next_batch(3)[0], helped.next_batch(3)[0])
    state = helped.state_dict()
    resumed = TextWindows(data, N_CTX, workers=2)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch(4)[0], alone.next_batch(4)[0])
    helped.load_state_dict(state)  # closes the running reader and its processes


def test_resume_refuses_a_changed_stream(corpus, tmp_path):
    text, vocab, _ = corpus
    source = stream_of(text, vocab)
    source.next_batch(3)
    state = source.state_dict()
    with pytest.raises(DataError, match="split over 1 processes; resume with 1"):
        stream_of(text, vocab, 0, 2).load_state_dict(state)
    with pytest.raises(DataError, match="prepared folder"):
        stream_of(text, vocab).load_state_dict({"window": 3})
    changed = tmp_path / "text"
    changed.mkdir()
    for f in text.iterdir():
        (changed / f.name).write_bytes(f.read_bytes())
    (changed / "a.txt").write_text("Another text entirely, shorter than before.\n")
    moved = stream_of(changed, vocab)
    # Refused when the state is loaded (before the trainer writes anything), naming the file.
    with pytest.raises(DataError, match=r"a.txt: the text changed since the checkpoint"):
        moved.load_state_dict({**state, "path": str(changed / "a.txt")})


def copy_of(text: Path, folder: Path) -> Path:
    folder.mkdir()
    for f in text.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def moved(state: dict, folder: Path) -> dict:
    """A checkpoint's stream state with its file paths in `folder` (a copy of the corpus)."""
    files = [[str(folder / Path(path).name), digest] for path, digest in state["files"]]
    return {**state, "path": str(folder / Path(state["path"]).name), "files": files}


def cursor_in(stream: TextWindows, file: str, past_doc: int) -> dict:
    """The stream's state once its cursor is in `file`, past document `past_doc`."""
    while True:
        stream.next_batch(1)
        state = json.loads(json.dumps(stream.state_dict()))  # what a checkpoint keeps
        if Path(state["path"]).name == file and state["doc"] > past_doc:
            return state


def test_resume_refuses_text_shifted_or_edited_before_the_cursor(corpus, tmp_path):
    """A document inserted in front of the file whose document at the cursor keeps its token
    count (a count cannot see it), an edit in a file read before the cursor's, a file put in
    front: each refused when the state is loaded, naming the file; the same text resumes."""
    text, vocab, _ = corpus
    state = cursor_in(stream_of(text, vocab), "b.txt", 3)
    same = tmp_path / "same"
    resumed = stream_of(copy_of(text, same), vocab)
    resumed.load_state_dict(moved(state, same))
    # b.txt's documents are separated by blank lines: repeat the document at the cursor in
    # front, so the document now at the cursor's number has exactly the recorded token count.
    docs = (text / "b.txt").read_text().split("\n\n")
    doc = state["doc"]
    shifted = copy_of(text, tmp_path / "shifted")
    (shifted / "b.txt").write_text("\n\n".join([docs[doc - 1], *docs]))
    assert docs[doc - 1] == (shifted / "b.txt").read_text().split("\n\n")[doc]
    edited = copy_of(text, tmp_path / "edited")
    (edited / "a.txt").write_text((text / "a.txt").read_text().replace(" the ", " a ", 1))
    assert (edited / "a.txt").read_text() != (text / "a.txt").read_text()
    in_front = copy_of(text, tmp_path / "in_front")
    (in_front / "a0.txt").write_text("A new file read first.\n")
    cases = [
        (shifted, rf"shifted/b.txt: the text changed .*up to number {doc + 1}"),
        (edited, r"edited/a.txt: the text changed .*not those the run read"),
        (in_front, r"b.txt, which is not file 2 of"),
    ]
    for folder, message in cases:
        with pytest.raises(DataError, match=message):
            stream_of(folder, vocab).load_state_dict(moved(state, folder))


def test_resume_from_a_checkpoint_without_digests_checks_the_token_count(corpus, tmp_path, caplog):
    """A cursor written before gpt1 recorded digests: accepted with a warning when the
    document at the cursor has its recorded token count, refused when it has not."""
    text, vocab, _ = corpus
    reference = stream_of(text, vocab)
    state = cursor_in(reference, "a.txt", 2)
    old = {k: v for k, v in state.items() if k not in ("files", "digest")}
    resumed = stream_of(text, vocab)
    with caplog.at_level("WARNING", logger="gpt1.text.stream"):
        resumed.load_state_dict(old)
    assert "records no digest" in caplog.text
    assert torch.equal(resumed.next_batch(2)[0], reference.next_batch(2)[0])
    changed = copy_of(text, tmp_path / "changed")
    docs = (text / "a.txt").read_text().split("\n\n")
    docs[old["doc"]] += " and more words"
    (changed / "a.txt").write_text("\n\n".join(docs))
    with pytest.raises(DataError, match=r"changed/a.txt: .*has \d+ tokens, not the"):
        stream_of(changed, vocab).load_state_dict({**old, "path": str(changed / "a.txt")})


def test_data_path_errors(corpus, tmp_path):
    text, vocab, prepared = corpus
    with pytest.raises(ConfigError, match="needs their tokenizer"):
        open_data(DataConfig(path=str(text / "a.txt")))
    with pytest.raises(DataError, match="no meta.json here"):
        open_data(DataConfig(path=str(text)))
    with pytest.raises(ConfigError, match="carries its own tokenizer"):
        open_data(DataConfig(path=str(prepared), tokenizer=str(vocab)))
    with pytest.raises(DataError, match="matches no .txt"):
        open_data(DataConfig(path=str(tmp_path / "*.jsonl"), tokenizer=str(vocab)))
    data = open_data(DataConfig(path=str(text / "*.txt"), tokenizer=str(vocab)))
    assert [f.name for f in data.files] == ["a.txt", "b.txt"]
    with pytest.raises(ConfigError, match="data.order=random needs"):
        batch_source(data, DataConfig(order="random"), N_CTX, 0, 0, 1)
    (tmp_path / "tiny.txt").write_text("Too short.\n")
    tiny = open_data(DataConfig(path=str(tmp_path / "tiny.txt"), tokenizer=str(vocab)))
    with pytest.raises(DataError, match="fewer than one window of 33"):
        TextWindows(tiny, N_CTX).next_batch(1)


def test_data_that_is_not_a_file_or_folder_says_what_it_is(tmp_path, corpus):
    """`--data` naming a device, a FIFO, a symlink loop or a dangling symlink: one line saying
    which, with and without --tokenizer (and `gpt1 prepare --corpus` alike)."""
    _, vocab, _ = corpus
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.txt")
    cases = {
        "/dev/zero": "is a character device, not a file or folder",
        str(tmp_path / "fifo"): "is a FIFO (named pipe), not a file or folder",
        str(tmp_path / "loop-a"): "a symlink loop",
        str(tmp_path / "dangling"): f"a symlink to {tmp_path / 'gone.txt'}, which does not exist",
        str(tmp_path / "missing.txt"): "no such file or folder",
    }
    for path, message in cases.items():
        for extra in ([], ["--tokenizer", str(vocab)]):
            argv = tiny_pretrain(Path(path), tmp_path / "run", 1, *extra)
            assert faults_one_line(argv, f"{path}: {message}"), (path, extra)
        prepare_argv = ["prepare", "--corpus", path, "--vocab", str(vocab)]
        assert faults_one_line([*prepare_argv, "--out", str(tmp_path / "p")], message), path
    assert not (tmp_path / "run").exists() and not (tmp_path / "p").exists()


def faults_one_line(argv: list[str], message: str) -> bool:
    """Whether `gpt1 ARGV` is refused (exit 2) in one stderr line holding `message`."""
    from helpers.tiny import run_cli

    code, err = run_cli(argv)
    return code == 2 and len(err.splitlines()) == 1 and message in err


def test_pretrain_names_its_own_text_field_option(tmp_path, corpus):
    """A .jsonl without the `text` field: the error names `--text-field`, which pretrain
    takes (as `gpt1 prepare` does), and the run goes with it."""
    _, vocab, _ = corpus
    rows = "".join(
        json.dumps({"body": f"document {i} about the sea and ships."}) + "\n" for i in range(40)
    )
    (tmp_path / "a.jsonl").write_text(rows)
    argv = tiny_pretrain(tmp_path / "a.jsonl", tmp_path / "run", 1, "--tokenizer", str(vocab))
    assert faults_one_line(argv, "field 'text'")
    assert not (tmp_path / "run").exists()  # refused in the first update: nothing left
    assert faults_one_line(argv, "--text-field")
    assert main(["--quiet", *argv, "--text-field", "body", "--set", "data.n_ctx=16"]) == 0


def test_parquet_row_that_is_not_text_names_file_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["fine", None]}), tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"x.parquet, field 'text': row 2 is not a string"):
        list(documents(tmp_path / "x.parquet", PrepareOptions(), None))
    with pytest.raises(DataError, match="no such column"):
        list(documents(tmp_path / "x.parquet", PrepareOptions(text_field="body"), None))


def run_args(data: Path, out: Path, *extra: str) -> list[str]:
    """12 steps of the tiny model, every step logged, a checkpoint every 5."""
    return [
        "--quiet",
        *tiny_pretrain(data, out, 12, "--log-every", "1", "--save-every", "5", *extra),
    ]


def losses(run: Path) -> list[tuple[int, float]]:
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r]


def test_pretraining_on_text_equals_pretraining_on_its_shards(corpus, tmp_path):
    text, vocab, prepared = corpus
    raw, shards = tmp_path / "raw", tmp_path / "shards"
    assert (
        main(run_args(text, raw, "--tokenizer", str(vocab), "--set", "data.doc_sep=blank-line"))
        == 0
    )
    assert main(run_args(prepared, shards, "--set", "data.order=sequential")) == 0
    assert len(losses(raw)) == 12 and losses(raw) == losses(shards)  # bitwise, every step
    a = load_file(str(raw / "final" / "model.safetensors"))
    b = load_file(str(shards / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (raw / "final" / "vocab.json").is_file()  # the checkpoint carries the tokenizer
    random_order = tmp_path / "random"
    assert main(run_args(prepared, random_order, "--max-steps", "2")) == 0
    assert losses(random_order)[0] != losses(shards)[0]  # the default order is another one


def test_max_steps_are_required_for_text(corpus, tmp_path, capsys):
    text, vocab, _ = corpus
    args = run_args(text, tmp_path / "run", "--tokenizer", str(vocab), "--max-steps", "0")
    assert main(args) == 2
    assert "set --max-steps" in capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_stream_resumes_exactly(corpus, tmp_path):
    text, vocab, _ = corpus
    steps = 24  # 24 x 4 windows x 32 tokens: more than one pass over the text
    extra = ["--tokenizer", str(vocab), "--set", "data.doc_sep=blank-line"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    span = faults.timed_run(faults.pretrain_cmd(text, ref, steps) + extra)
    report = faults.kill_loop(
        faults.pretrain_cmd(text, run, steps) + extra + ["--resume", "auto"],
        run,
        kills=2,
        rng=random.Random(0),
        span=span,
        name="stream",
        steps=steps,
    )
    faults.compare_runs(ref, run, report)
    assert report.data_lost == 0, report.problems
    assert report.kills >= 1 and report.resumes >= 1
    cursor = json.loads((ref / "final" / "trainer_state.json").read_text())["sources"][0]
    assert cursor["epoch"] >= 1 and cursor["kind"] == "text-stream"
    assert np.isfinite([loss for _, loss in losses(run)]).all()


@pytest.mark.slow
def test_two_processes_split_the_stream_and_resume_exactly(corpus, tmp_path):
    import subprocess
    import sys

    text, vocab, _ = corpus
    torchrun = list(TORCHRUN_TWO_PROCESSES)
    two, resumed = tmp_path / "two", tmp_path / "resumed"

    def launch(out: Path, *extra: str, launcher=torchrun) -> subprocess.CompletedProcess:
        args = run_args(
            text, out, "--tokenizer", str(vocab), "--max-steps", "6", "--save-every", "3"
        )
        argv = [*launcher, "-m", "gpt1", *args, "--set", "data.doc_sep=blank-line", *extra]
        return subprocess.run(argv, env=subprocess_env(), capture_output=True, text=True)

    assert launch(two).returncode == 0
    cursors = json.loads((two / "step-3" / "trainer_state.json").read_text())["sources"]
    assert [(c["rank"], c["world"]) for c in cursors] == [(0, 2), (1, 2)]
    assert cursors[0]["index"] % 2 == 0 and cursors[1]["index"] % 2 == 1  # alternate documents
    assert launch(resumed, "--resume", str(two / "step-3")).returncode == 0
    assert losses(resumed) == [(s, v) for s, v in losses(two) if s > 3]
    alone = launch(tmp_path / "alone", "--resume", str(two / "step-3"), launcher=[sys.executable])
    assert alone.returncode == 2
    assert "split over 2 processes; resume with 2 (this run has 1)" in alone.stderr


def test_a_bad_row_stops_the_stream_when_reached_naming_file_line_and_field(corpus, tmp_path):
    text, vocab, _ = corpus
    bad = tmp_path / "text"
    bad.mkdir()
    (bad / "a.txt").write_bytes((text / "a.txt").read_bytes())
    (bad / "b.jsonl").write_text('{"text": "fine"}\n{"body": "no text here"}\n')
    data = open_data(DataConfig(path=str(bad), tokenizer=str(vocab), doc_sep="blank-line"))
    stream = TextWindows(data, N_CTX)
    with pytest.raises(DataError, match=r"b.jsonl:2, field 'text': missing or not a string"):
        for _ in range(100):
            stream.next_batch(1)
    with pytest.raises(DataError, match="no such file or folder"):
        open_data(DataConfig(path=str(tmp_path / "nope"), tokenizer=str(vocab)))


def test_sequential_windows_split_every_micro_step_between_ranks(corpus):
    split = open_prepared(corpus[2]).splits["train"]
    alone = SequentialWindows(split, N_CTX)
    ranks = [SequentialWindows(split, N_CTX, r, 2) for r in (0, 1)]
    for _ in range(40):  # past the end of the split: the stream starts over
        both = torch.cat([ranks[0].next_batch(2)[0], ranks[1].next_batch(2)[0]])
        assert torch.equal(both, alone.next_batch(4)[0])
    resumed = SequentialWindows(split, N_CTX, 1, 2)
    resumed.load_state_dict(ranks[1].state_dict())
    assert torch.equal(resumed.next_batch(3)[0], ranks[1].next_batch(3)[0])
