"""Exports for other tools: the transformers tokenizer gives gpt1's ids, the trained window and the
start token are carried, task heads map exactly (or are written beside), ONNX and lm-eval agree."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpt1 import GPT, ModelConfig, save_model
from gpt1.cli import main
from gpt1.model.heads import FinetuneModel
from gpt1.recipes.convert import convert
from gpt1.recipes.finetune import writer
from helpers.tiny import ODD_SIZES_MODEL

transformers = pytest.importorskip("transformers")
from transformers import AutoTokenizer, OpenAIGPTDoubleHeadsModel, OpenAIGPTLMHeadModel  # noqa: E402

TRICKY = [
    "It's 3.5 -- doesn't \"Mr. Smith\" know?",
    "''Cause I said so,'' she said.",
    "Caf\u00e9 \u201cquoted\u201d \u2014 \u2018single\u2019\u2026 e.g. 5km a.m. u.s.",
    "Tom &amp; Jerry &lt;3 &eacute;t\u00e9",
    "line one\n\n  line two <unk> end",
    "",
    "don't can't won't gonna cannot y'all o'clock ma'am 'em 'em's",
    "x...y ... end...!!! ??",
    "A:B 10:30 $5 5% #1 @user www.example.com (1,000) [a] {b} |c| ~d~ \u00bfs\u00ed?",
    "\u03a3\u039f\u03a3 ﬁne \uff21\uff22",
]


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Perturb every parameter (zero biases and unit gains would hide a mix-up)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def write_run(
    folder: Path, vocab: Path | None, kind: str, n_outputs: int, seed: int, **record
) -> Path:
    """A fine-tuned checkpoint folder: a randomized GPT of `ODD_SIZES_MODEL`'s shape (over `vocab`'s ids when
    given) with task tokens and a `kind` head, and its task.json (`record`: the task's fields)."""
    torch.manual_seed(0)
    gpt = GPT(ModelConfig(**{**ODD_SIZES_MODEL, "vocab_size": 40478} if vocab else ODD_SIZES_MODEL))
    classify = gpt.add_tokens(3)[2]
    model = randomized(FinetuneModel(gpt, kind, n_outputs, classify), seed)
    record = {
        "kind": kind,
        "n_outputs": n_outputs,
        "n_ctx": ODD_SIZES_MODEL["n_positions"],
        "classify_id": classify,
        "question_delimiter": False,
        "clf_pdrop": 0.1,
        **record,
    }
    folder.mkdir()
    writer(vocab, record, {})(model, folder)
    return folder


def finetuned(tmp: Path, kind: str, n_outputs: int) -> Path:
    """A fine-tuned toy-task checkpoint folder (no tokenizer)."""
    labels = [str(i) for i in range(n_outputs)]  # as `gpt1 finetune` writes them
    return write_run(
        tmp / f"ft-{kind}-{n_outputs}", None, kind, n_outputs, 1, task=f"toy-{kind}", labels=labels
    )


def task_inputs(K: int, classify: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, K, T] in the task layout (start ... classify, then right padding) and the mask."""
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 12
    ids = torch.zeros(B, K, T, dtype=torch.long)
    mask = torch.zeros(B, K, T)
    for b in range(B):
        for k in range(K):
            n = int(torch.randint(4, T + 1, (1,), generator=g))
            ids[b, k, 0] = classify - 2
            ids[b, k, 1 : n - 1] = torch.randint(1, 100, (n - 2,), generator=g)
            ids[b, k, n - 1] = classify
            mask[b, k, :n] = 1
    return ids, mask


def ours(folder: Path, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """gpt1's task output for the checkpoint written by `finetuned` (it has no tokenizer)."""
    from gpt1 import load_checkpoint

    record = json.loads((folder / "task.json").read_text())
    model = FinetuneModel(
        load_checkpoint(folder), record["kind"], record["n_outputs"], record["classify_id"]
    )
    model.head.load_state_dict(load_file(folder / "head.safetensors"))
    model.eval()
    with torch.no_grad():
        return model(ids, mask, with_lm=False)[0]


# ------------------------------------------------------------------------------ tokenizer
def test_default_auto_tokenizer_gives_gpt1_ids(tmp_path, gpt1_vocab):
    from gpt1.text.tokenizer import Tokenizer

    save_model(
        GPT(ModelConfig(**{**ODD_SIZES_MODEL, "vocab_size": 40478})), tmp_path / "ck", gpt1_vocab
    )
    notes: list[str] = []
    convert(tmp_path / "ck", tmp_path / "hf", "gpt1", "hf", notes=notes)
    ref = Tokenizer.from_dir(gpt1_vocab)
    fast = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(fast).__name__ == "OpenAIGPTTokenizerFast"
    for text in TRICKY:
        assert fast.encode(text) == ref.encode(text), text
    # the ids people complained about: "it 's", "3.5", "--", "does n't"
    assert fast.tokenize("It's 3.5 -- doesn't") == [
        "it</w>",
        "'s</w>",
        "3.",
        "5</w>",
        "--</w>",
        "does</w>",
        "n't</w>",
    ]
    slow = AutoTokenizer.from_pretrained(tmp_path / "hf", use_fast=False)
    if slow.fix_text is not None:  # ftfy + spaCy present: the slow class is exact
        for text in TRICKY:
            assert slow.encode(text) == ref.encode(text), text
    assert fast.decode(fast.encode("It's fine.")) == ref.decode(ref.encode("It's fine."))
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "use_fast=False" in card and any("use_fast=False" in n for n in notes)


def test_tokenizer_config_start_token_and_window(tmp_path, gpt1_vocab):
    run = tmp_path / "run"
    save_model(
        randomized(GPT(ModelConfig(**{**ODD_SIZES_MODEL, "vocab_size": 40478})), 2),
        run / "final",
        gpt1_vocab,
    )
    (run / "run.json").write_text(json.dumps({"data": {"n_ctx": 16}}))
    notes: list[str] = []
    convert(run, tmp_path / "hf", "gpt1", "hf", notes=notes)
    # the whole position table, as gpt1, serve and ONNX accept; the trained window is stated
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["n_positions"] == 24
    assert any("n_positions=24" in n and "model_max_length=16" in n for n in notes)
    assert "trained on windows of 16 tokens" in (tmp_path / "hf" / "README.md").read_text()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.model_max_length == 16 and tok.bos_token == "<unk>" and tok.bos_token_id == 0
    assert tok.pad_token_id == 0
    hf = OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.transformer.positions_embed.weight.shape[0] == 24
    from gpt1 import load_checkpoint

    gpt = load_checkpoint(run).eval()
    x = torch.randint(0, 40478, (2, 24))
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, gpt.lm_logits(gpt(x)), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------ task heads
def converted_run(
    tmp: Path, kind: str, n_outputs: int, note: str, architecture: str
) -> tuple[Path, dict]:
    """A fine-tuned run of `kind` converted to transformers' layout in tmp/hf, checking that the
    conversion notes say `note` and config.json names `architecture`: (the run, the config)."""
    folder = finetuned(tmp, kind, n_outputs)
    notes: list[str] = []
    convert(folder, tmp / "hf", "gpt1", "hf", notes=notes)
    assert any(note in n for n in notes)
    config = json.loads((tmp / "hf" / "config.json").read_text())
    assert config["architectures"] == [architecture]
    return folder, config


@pytest.mark.parametrize("kind,n_outputs,K", [("choice", 1, 4), ("single", 1, 1), ("pair", 1, 1)])
def test_head_maps_onto_double_heads_exactly(tmp_path, kind, n_outputs, K):
    folder, config = converted_run(
        tmp_path, kind, n_outputs, "OpenAIGPTDoubleHeadsModel", "OpenAIGPTDoubleHeadsModel"
    )
    hf = OpenAIGPTDoubleHeadsModel.from_pretrained(tmp_path / "hf").eval()
    classify = config["gpt1_task"]["classify_id"]
    ids, mask = task_inputs(K, classify)
    mc_token_ids = (ids == classify).int().argmax(dim=-1)  # [B, K]
    with torch.no_grad():
        out = hf(ids, mc_token_ids=mc_token_ids)
    want = ours(folder, ids, mask)
    got = out.mc_logits if kind == "choice" else out.mc_logits[:, 0]
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=0)
    # the softmax over choices (the task's probabilities) agrees as well
    if kind == "choice":
        assert torch.allclose(got.softmax(-1), want.softmax(-1), atol=1e-6)
    assert (tmp_path / "hf" / "task_head.safetensors").is_file()


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_every_exported_file_follows_the_umask(tmp_path, mask):
    """The head's weights get the mode of the files beside them, not safetensors' 0600."""
    old = os.umask(mask)
    try:
        converted_run(tmp_path, "single", 3, "no transformers class", "OpenAIGPTLMHeadModel")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert "task_head.safetensors" in modes and set(modes.values()) == {0o666 & ~mask}, modes


@pytest.mark.parametrize(
    "kind,n_outputs,K", [("single", 3, 1), ("pair", 2, 1), ("similarity", 1, 2)]
)
def test_other_heads_are_written_beside_the_lm(tmp_path, kind, n_outputs, K):
    folder, config = converted_run(
        tmp_path, kind, n_outputs, "no transformers class", "OpenAIGPTLMHeadModel"
    )
    info = json.loads((tmp_path / "hf" / "task_head.json").read_text())
    head = load_file(tmp_path / "hf" / "task_head.safetensors")
    assert info["kind"] == kind and info["n_outputs"] == n_outputs
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "task_head.safetensors" in card
    # the documented recipe, applied to transformers' hidden states, gives gpt1's output
    hf = OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    classify = config["gpt1_task"]["classify_id"]
    ids, mask = task_inputs(K, classify)
    B, _, T = ids.shape
    with torch.no_grad():
        hidden = hf.transformer(ids.view(B * K, T)).last_hidden_state  # [B*K, T, C]
    pos = (ids.view(B * K, T) == classify).int().argmax(dim=1)
    states = hidden[torch.arange(B * K), pos].view(B, K, -1)
    h = states.sum(dim=1) if kind == "similarity" else states[:, 0]
    got = h @ head["linear.weight"].T + head["linear.bias"]
    want = ours(folder, ids, mask)
    assert torch.allclose(got.squeeze(-1) if n_outputs == 1 else got, want, atol=1e-5, rtol=0)


# A csv task of each kind: (columns, labels or None for regression, rows, predict's arguments).
CSV_TASKS = {
    "single": (
        {"text": "text", "label": "y"},
        ["neg", "pos", "meh"],
        [{"text": "A charming film.", "y": "pos"}, {"text": "It's dull -- don't.", "y": "neg"}],
        lambda r: (r["text"],),
    ),
    "pair": (
        {"a": "a", "b": "b", "label": "y"},
        ["no", "yes"],
        [{"a": "A man plays.", "b": "Music is made.", "y": "yes"}, {"a": "Rain.", "b": "Sun."}],
        lambda r: (r["a"], r["b"]),
    ),
    "similarity": (
        {"a": "a", "b": "b", "label": "y"},
        None,
        [{"a": "A dog runs.", "b": "A dog is running.", "y": "4.2"}, {"a": "Hi.", "b": "Bye."}],
        lambda r: (r["a"], r["b"]),
    ),
    "choice": (
        {"context": "c", "question": "q", "choices": "x|w|z", "label": "y"},
        ["0", "1", "2"],  # the answer's index
        [
            {
                "c": "Tom missed the bus.",
                "q": "",
                "x": "He walked.",
                "w": "He ran.",
                "y": "0",
                "z": "He flew.",
            },
            {"c": "It rained.", "q": "Then?", "x": "Wet.", "w": "Grey.", "y": "1", "z": "Dry."},
        ],
        lambda r: (r["c"], r["q"], [r["x"], r["w"], r["z"]]),
    ),
}


def csv_run(tmp: Path, vocab: Path, kind: str, question_delimiter: bool = False) -> Path:
    """A fine-tuned checkpoint of a csv task of `kind` (random weights, gpt1's tokenizer)."""
    columns, labels, _, _ = CSV_TASKS[kind]
    spec = {"columns": columns, "labels": labels, "regression": labels is None}  # csv flags
    if kind == "similarity":
        spec["similarity"] = True
    from gpt1.tasks.registry import complete_generic_spec, get_task

    task = get_task("csv", complete_generic_spec("csv", spec, tmp, "train"))
    return write_run(
        tmp / f"run-{kind}",
        vocab,
        task.kind,
        task.n_outputs,
        7,
        task="csv",
        labels=task.labels,
        spec=task.spec,
        question_delimiter=question_delimiter,
    )


def card_code(folder: Path) -> str:
    """The Python block of the card's 'Loading the classifier' section, as printed."""
    card = (folder / "README.md").read_text()
    section = card.split("## Loading the classifier", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    "kind,question_delimiter",
    [
        ("single", False),
        ("pair", False),
        ("similarity", False),
        ("choice", False),
        ("choice", True),
    ],
)
def test_card_code_reproduces_gpt1_predict(tmp_path, gpt1_vocab, kind, question_delimiter):
    import csv

    from gpt1.recipes.evaluate import ScoringOptions, predict_run

    columns, labels, rows, arguments = CSV_TASKS[kind]
    data = tmp_path / "rows.csv"
    names = list(dict.fromkeys(k for r in rows for k in r))
    with open(data, "w", newline="") as fh:
        out = csv.DictWriter(fh, names)
        out.writeheader()
        out.writerows(rows)
    (tmp_path / "train.csv").write_text(data.read_text())
    run = csv_run(tmp_path, gpt1_vocab, kind, question_delimiter)
    export = tmp_path / "hf"
    notes: list[str] = []
    convert(run, export, "gpt1", "hf", notes=notes)
    (written,) = predict_run(ScoringOptions(run, file=data, out=tmp_path / "p"), "jsonl")
    want = [json.loads(line) for line in written.read_text().splitlines()]
    namespace: dict = {}
    code = card_code(export)
    assert f"path = {str(export)!r}" in code
    exec(compile(code, "README.md", "exec"), namespace)  # the example call prints; fine
    for row, expected in zip(rows, want):
        got = namespace["predict"](*arguments(row))
        if "score" in expected:
            assert got == pytest.approx(expected["score"], abs=1e-4)
        elif isinstance(got, dict):
            assert list(got) == list(expected["probabilities"])
            assert list(got.values()) == pytest.approx(list(expected["probabilities"].values()))
        else:
            assert got == pytest.approx(expected["probabilities"], abs=1e-5)
    config = json.loads((export / "config.json").read_text())
    if labels and kind != "choice":
        assert config["id2label"] == {str(i): name for i, name in enumerate(labels)}
        assert config["label2id"] == {name: i for i, name in enumerate(labels)}
    double = config["architectures"] == ["OpenAIGPTDoubleHeadsModel"]
    warned = [n for n in notes if "AutoModelForSequenceClassification" in n and "RANDOM" in n]
    assert bool(warned) != double  # said loudly exactly where no class holds the head
    card = (export / "README.md").read_text()
    assert ("would load a RANDOM" in card) != double


def test_convert_prints_the_notes(tmp_path, capsys, gpt1_vocab):
    save_model(
        GPT(ModelConfig(**{**ODD_SIZES_MODEL, "vocab_size": 40478})), tmp_path / "ck", gpt1_vocab
    )
    assert (
        main(
            ["convert", str(tmp_path / "ck"), str(tmp_path / "hf"), "--from", "gpt1", "--to", "hf"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"AutoTokenizer.from_pretrained({tmp_path / 'hf'}, use_fast=False)" in out


def _damage(folder: Path, damage: str) -> str:
    """Damage a fine-tuned folder's task record or head; the file the refusal must name."""
    record = json.loads((folder / "task.json").read_text())
    if damage == "head shape":
        from safetensors.torch import save_file

        head = load_file(folder / "head.safetensors")
        save_file({k: torch.cat([v, v]) for k, v in head.items()}, folder / "head.safetensors")
        return "head.safetensors"
    if damage == "huge integer":  # past Python's 4,300-digit conversion limit
        text = json.dumps(record).replace(
            f'"n_outputs": {record["n_outputs"]}', '"n_outputs": ' + "9" * 5000
        )
        (folder / "task.json").write_text(text)
    else:
        (folder / "task.json").write_text(json.dumps({**record, "kind": 7}))
    return "task.json"


@pytest.mark.parametrize("to", ["hf", "onnx"])
@pytest.mark.parametrize("damage", ["head shape", "huge integer", "bad kind"])
def test_a_damaged_finetuned_run_is_refused_in_one_line_by_every_export(
    tmp_path, capsys, to, damage
):
    """The exporters read task.json and the head through the checked reader
    (`read_task_head`): a damaged record or head is a one-line refusal naming the file."""
    if to == "onnx":
        pytest.importorskip("onnxscript")
    folder = finetuned(tmp_path, "single", 3)
    named = _damage(folder, damage)
    out = tmp_path / ("export.onnx" if to == "onnx" else "export")
    assert main(["convert", str(folder), str(out), "--from", "gpt1", "--to", to]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{folder / named}" in err, err
    assert not out.exists()


# ------------------------------------------------------------------------------------ ONNX
def test_onnx_language_model_matches(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    gpt = randomized(GPT(ModelConfig(**ODD_SIZES_MODEL)), 4)
    save_model(gpt, tmp_path / "ck")
    out = convert(tmp_path / "ck", tmp_path / "lm.onnx", "gpt1", "onnx")
    session = ort.InferenceSession(str(out))
    for shape in [(1, 3), (3, 17), (2, 24)]:  # dynamic batch and sequence
        x = torch.randint(0, ODD_SIZES_MODEL["vocab_size"], shape)
        got = torch.from_numpy(session.run(None, {"input_ids": x.numpy()})[0])
        with torch.no_grad():
            want = gpt.lm_logits(gpt(x))
        assert torch.allclose(got, want, atol=1e-4, rtol=0), shape


def test_onnx_export_prints_its_summary_not_the_optimizer_log(tmp_path, capsys):
    pytest.importorskip("onnxscript")
    save_model(GPT(ModelConfig(**ODD_SIZES_MODEL)), tmp_path / "ck")
    argv = ["convert", str(tmp_path / "ck"), str(tmp_path / "lm.onnx"), "--from", "gpt1"]
    assert main([*argv, "--to", "onnx"]) == 0
    captured = capsys.readouterr()
    assert "Replaced initializer" not in captured.err and "constant folding" not in captured.err
    # the only status line is the thread count every computing command announces
    assert [line for line in captured.err.splitlines() if not line.startswith("threads: ")] == []
    assert captured.out.splitlines()[0] == f"wrote onnx model to {tmp_path / 'lm.onnx'}"


@pytest.mark.parametrize("kind,n_outputs,K", [("single", 3, 1), ("choice", 1, 4)])
def test_onnx_task_model_matches(tmp_path, kind, n_outputs, K):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    folder = finetuned(tmp_path, kind, n_outputs)
    out = convert(folder, tmp_path / "task.onnx", "gpt1", "onnx")
    session = ort.InferenceSession(str(out))
    classify = json.loads((folder / "task.json").read_text())["classify_id"]
    for seed in (3, 4):
        ids, mask = task_inputs(K, classify, seed)
        got = torch.from_numpy(session.run(None, {"input_ids": ids.numpy()})[0])
        assert torch.allclose(got, ours(folder, ids, mask), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------- lm-eval
def test_lm_eval_hf_model_runs_on_the_export(tmp_path, gpt1_vocab):
    """lm-evaluation-harness's own `hf` model loads the export: the start token is found, the
    trained window is kept with max_length (as the card says), and scores equal gpt1's."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")  # lm_eval's hf model needs it
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from gpt1 import load_checkpoint
    from gpt1.text.tokenizer import Tokenizer

    run = tmp_path / "run"
    save_model(
        randomized(GPT(ModelConfig(**{**ODD_SIZES_MODEL, "vocab_size": 40478})), 5),
        run / "final",
        gpt1_vocab,
    )
    (run / "run.json").write_text(json.dumps({"data": {"n_ctx": 20}}))
    convert(run, tmp_path / "hf", "gpt1", "hf")
    lm = HFLM(pretrained=str(tmp_path / "hf"), device="cpu", batch_size=2, max_length=20)
    assert lm.max_length == 20 and lm.prefix_token_id == 0
    gpt, tok = load_checkpoint(run).eval(), Tokenizer.from_dir(gpt1_vocab)

    def logprob(context: list[int], target: list[int]) -> float:
        x = torch.tensor([context + target])
        with torch.no_grad():
            logp = gpt.lm_logits(gpt(x)).log_softmax(-1)[0]
        return sum(float(logp[len(context) - 1 + i, t]) for i, t in enumerate(target))

    pairs = [("The cat sat on the", " mat."), ("It's 3.5 miles,", " isn't it?")]
    reqs = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    for (context, cont), (got, _) in zip(pairs, lm.loglikelihood(reqs)):
        assert math.isclose(got, logprob(tok.encode(context), tok.encode(cont)), abs_tol=1e-4)
    text = "A whole text, scored from its first token."
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    assert math.isclose(rolling, logprob([0], tok.encode(text)), abs_tol=1e-4)
    # generation needs an end token to decode (None crashed the harness): greedy equals gpt1's
    ids = tok.encode("The cat sat on the")
    for _ in range(5):
        with torch.no_grad():
            ids.append(int(gpt.lm_logits(gpt(torch.tensor([ids])))[0, -1].argmax()))
    request = ("The cat sat on the", {"until": ["\n\n"], "max_gen_toks": 5, "do_sample": False})
    text = lm.generate_until([Instance("generate_until", {}, request, 0)])[0]
    assert text.strip() == tok.decode(ids[-5:])


# ------------------------------------------------------------------------------ decoding
def _held_out(shared: Path, chars: int) -> str:
    """Held-out text with blank lines, headings and punctuation: wikitext-2's test split."""
    return (shared / "corpus" / "wikitext-2" / "test.txt").read_text(encoding="utf-8")[:chars]


def _exported(tmp: Path, name: str, vocab: Path, n_vocab: int, finetuned_: bool) -> tuple:
    """(gpt1's tokenizer, `AutoTokenizer.from_pretrained` of the export) for a checkpoint over
    `vocab`: a pretrained LM, or a fine-tuned model (whose export holds the task tokens)."""
    from gpt1.text.tokenizer import Tokenizer

    if finetuned_:
        source = write_run(tmp / name, vocab, "single", 2, 1, task="sst2", labels=["0", "1"])
    else:
        source = save_model(
            GPT(ModelConfig(**{**ODD_SIZES_MODEL, "vocab_size": n_vocab})), tmp / name, vocab
        )
    convert(source, tmp / f"{name}-hf", "gpt1", "hf", notes=[])
    return Tokenizer.from_dir(source), AutoTokenizer.from_pretrained(tmp / f"{name}-hf")


def _check_decodes_alike(ours, theirs, text: str) -> None:
    """gpt1's decode equals the export's on the ids of `text`, on every single id the export
    knows, and on random id sequences (newline, task and <unk> tokens included)."""
    ids = ours.encode(text)
    newline = ours.encoder["\n</w>"]
    assert newline in ids  # the text holds the token the old decoder dropped
    assert ours.decode(ids) == theirs.decode(ids)
    assert ours.decode(ids[: ids.index(newline) + 1]).endswith("\n")
    known = range(len(theirs))
    assert [ours.decode([i]) for i in known] == theirs.batch_decode([[i] for i in known])
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, len(theirs), (int(n),), generator=g).tolist() for n in range(1, 200)]
    rows += [[newline] * 3, [newline, 0, newline], [0, newline], []]
    assert [ours.decode(r) for r in rows] == theirs.batch_decode(rows)


@pytest.mark.parametrize("finetuned_", [False, True], ids=["lm", "finetuned"])
def test_decode_equals_the_exported_tokenizer_on_gpt1_vocabulary(
    tmp_path, gpt1_vocab, shared_data, finetuned_
):
    ours, theirs = _exported(tmp_path, "ck", gpt1_vocab, 40478, finetuned_)
    assert len(theirs) == (40481 if finetuned_ else 40478)
    _check_decodes_alike(ours, theirs, _held_out(shared_data, 20_000))
    if finetuned_:
        ids = [ours.start_id, 3570, ours.delimiter_id, 3570, ours.classify_id]
        assert (
            theirs.decode(ids) == ours.decode(ids) == "_start_ hello _delimiter_ hello _classify_"
        )


def test_decode_equals_the_exported_tokenizer_on_a_trained_vocabulary(tmp_path, shared_data):
    from gpt1.text.tokenizer import Tokenizer

    shakespeare = (shared_data / "corpus" / "tinyshakespeare" / "input.txt").read_text()[:30_000]
    trained = Tokenizer.train([shakespeare], merges=300)
    trained.save(tmp_path / "vocab")
    ours, theirs = _exported(tmp_path, "ck", tmp_path / "vocab", trained.vocab_size, False)
    # held-out text of another corpus: many pieces unknown to this vocabulary (<unk>)
    _check_decodes_alike(ours, theirs, _held_out(shared_data, 5_000))
