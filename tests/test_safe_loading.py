"""Untrusted files are safe to open: crafted pickles are refused (and never run), torch files are
read with `weights_only=True`, damaged training state is a clear error, and nothing a config or a
dataset contains can make a run write outside its run folder."""

from __future__ import annotations

import ast
import json
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gpt1.checkpoint_files import WEIGHTS, load_state_dict
from gpt1.config import model_preset
from gpt1.errors import CheckpointError, Gpt1Error
from gpt1.model.checkpoint import load_checkpoint
from gpt1.model.gpt import GPT
from gpt1.train.state import TRAINER_JSON, TRAINER_TENSORS, latest_resumable, load_training_state
from helpers.tiny import char_vocab, make_corpus, tiny_checkpoint, tiny_finetune

ROOT = Path(__file__).resolve().parents[1]


class _Payload:
    """Unpickling this runs `open(marker, "w")`: proof that a loader executed pickled code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_pickle(path: Path, marker: Path, kind: str) -> None:
    """A malicious weights file: a raw pickle, or a torch.save zip archive holding one."""
    if kind == "pickle":
        path.write_bytes(pickle.dumps({"wte.weight": _Payload(marker)}, protocol=2))
    else:
        torch.save({"wte.weight": _Payload(marker)}, path)  # zip archive with data.pkl inside
        assert zipfile.is_zipfile(path)
    assert not marker.exists()


def assert_pickle_refused(
    path: Path, kind: str, match: str, load: Callable[[Path], object], folder: Path
) -> pytest.ExceptionInfo:
    """With a crafted pickle of `kind` at `path`, `load(folder)` raises a CheckpointError
    matching `match`, and the pickle's code never runs."""
    marker = path.parent / "pwned"
    write_pickle(path, marker, kind)
    with pytest.raises(CheckpointError, match=match) as err:
        load(folder)
    assert not marker.exists()
    return err


@pytest.mark.parametrize("kind", ["pickle", "torch-zip"])
def test_crafted_pickle_as_weights_is_refused(tmp_path, kind):
    folder = tiny_checkpoint(tmp_path / "ckpt", vocab=False)
    err = assert_pickle_refused(folder / WEIGHTS, kind, "pickle", load_checkpoint, folder)
    assert str(folder / WEIGHTS) in str(err.value)


def test_pickle_next_to_missing_weights_is_named_not_loaded(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", vocab=False)
    (folder / WEIGHTS).unlink()
    match = "pytorch_model.bin.*never loaded"
    assert_pickle_refused(folder / "pytorch_model.bin", "torch-zip", match, load_checkpoint, folder)


def test_crafted_pickle_in_trainer_state_is_refused(tmp_path):
    folder = tiny_checkpoint(tmp_path / "run" / "step-1", vocab=False)
    (folder / TRAINER_JSON).write_text(json.dumps({"step": 1}))
    assert_pickle_refused(folder / TRAINER_TENSORS, "pickle", "pickle", load_training_state, folder)


def test_hf_pytorch_model_bin_is_read_weights_only(tmp_path):
    """`gpt1 convert --from hf` reads pytorch_model.bin, but only with weights_only=True."""
    from gpt1.recipes.convert import read_hf_weights

    weights = tmp_path / "pytorch_model.bin"
    assert_pickle_refused(weights, "torch-zip", "pytorch_model.bin", read_hf_weights, tmp_path)
    # A plain tensor dict still loads: weights_only is a filter, not a refusal of every .bin.
    torch.save({"w": torch.arange(3.0)}, tmp_path / "pytorch_model.bin")
    assert torch.equal(read_hf_weights(tmp_path)["w"], torch.arange(3.0))


def test_every_torch_load_in_the_package_is_weights_only():
    """Static guard: no `torch.load` without `weights_only=True`, no `pickle.load(s)`, and no
    `np.load` that allows pickles anywhere in gpt1/."""
    offenders = []
    for file in (ROOT / "gpt1").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            kw = {k.arg: k.value for k in node.keywords}
            where = f"{file.relative_to(ROOT)}:{node.lineno}"
            if owner == "torch" and node.func.attr == "load":
                flag = kw.get("weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    offenders.append(where)
            if owner in ("pickle", "dill", "cloudpickle") and node.func.attr in ("load", "loads"):
                offenders.append(where)
            if owner in ("np", "numpy") and node.func.attr == "load":
                flag = kw.get("allow_pickle")
                if not (isinstance(flag, ast.Constant) and flag.value is False):
                    offenders.append(where)
    assert offenders == []


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b'{"step": "../../x"}',
        b"[1, 2]",
        b'{"step": 1}',
        b"\xff\xfe garbage",
        b'{"step": 1, "sources": [{}], "optimizer": {"state": [], "param_groups": []}}',
    ],
)
def test_damaged_trainer_state_is_a_checkpoint_error(tmp_path, content):
    """Resuming from a hand-edited or damaged trainer_state.json never crashes with a bare
    KeyError/ValueError/TypeError: it is a CheckpointError naming the folder."""
    from gpt1.train import distributed as dist
    from gpt1.train.loop import _load_state

    run = tmp_path / "run"
    folder = tiny_checkpoint(run / "step-3", vocab=False)
    (folder / TRAINER_JSON).write_bytes(content)
    from safetensors.torch import save_file

    save_file({"rng/0/cpu": torch.get_rng_state()}, str(folder / TRAINER_TENSORS))
    model = GPT(model_preset("tiny"))
    opt = torch.optim.AdamW(model.parameters())

    class Source:
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            dict(state)

    with pytest.raises(CheckpointError) as err:
        latest_resumable(run)
        _load_state(folder, model, opt, Source(), dist.env_info(), torch.device("cpu"), False)
    assert "step-3" in str(err.value)


def test_crafted_pickle_as_finetune_head_is_refused(tmp_path):
    """A fine-tuned folder's head.safetensors goes through the same safe loader."""
    from gpt1.checkpoint_files import HEAD_FILE, TASK_FILE
    from gpt1.recipes.evaluate import load_finetuned

    folder = tiny_checkpoint(tmp_path / "ft", vocab=False)
    (folder / TASK_FILE).write_text(
        json.dumps(
            {"task": "sst2", "kind": "single", "n_outputs": 2, "classify_id": 3, "n_ctx": 16}
        )
    )
    assert_pickle_refused(folder / HEAD_FILE, "pickle", "head.safetensors", load_finetuned, folder)


def test_truncated_safetensors_is_a_checkpoint_error(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", vocab=False)
    data = (folder / WEIGHTS).read_bytes()
    for cut in (0, 5, 8, 100, len(data) // 2, len(data) - 1):
        (folder / WEIGHTS).write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            load_state_dict(folder / WEIGHTS)


def _retype(folder: Path, name: str, dtype: torch.dtype) -> None:
    """Rewrite one tensor of the checkpoint's weights in another type."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / WEIGHTS))
    state[name] = state[name].to(dtype)
    save_file(state, str(folder / WEIGHTS))


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.bool, torch.uint8])
def test_weights_of_a_type_the_model_cannot_take_are_refused_naming_the_tensor(tmp_path, dtype):
    folder = tiny_checkpoint(tmp_path / "ckpt", vocab=False)
    _retype(folder, "h.1.mlp.c_fc.weight", dtype)
    with pytest.raises(CheckpointError, match="model.safetensors: tensor 'h.1.mlp.c_fc.weight'"):
        load_checkpoint(folder)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_load_as_the_model_s_float32(tmp_path, dtype):
    folder = tiny_checkpoint(tmp_path / "ckpt", vocab=False)
    _retype(folder, "wte.weight", dtype)
    model = load_checkpoint(folder)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.float32


def test_commands_refuse_an_int32_tensor_in_one_line_and_finetune_from_bf16(tmp_path):
    """Every loading command takes the same path: an int32 tensor is one line naming file and
    tensor (exit 2) before anything is written; bf16 weights fine-tune like fp32 ones."""
    from helpers.tiny import make_task, run_cli

    sizes = dict(vocab_size=189, n_positions=32, n_embd=32, n_layer=2, n_head=4)  # char_vocab's
    good = tiny_checkpoint(tmp_path / "good", sizes)
    bad = tiny_checkpoint(tmp_path / "bad", sizes)
    _retype(bad, "wte.weight", torch.int32)
    task = make_task(tmp_path / "task")
    for command in (
        ["sample", str(bad), "--prompt", "ab", "--max-new-tokens", "2"],
        ["convert", str(bad), str(tmp_path / "hf"), "--from", "gpt1", "--to", "hf"],
        ["finetune", *tiny_finetune(task, tmp_path / "vocab", tmp_path / "ft", 1)[1:]]
        + ["--init", str(bad)],
    ):
        code, err = run_cli(command)
        assert code == 2 and "\n" not in err, err
        assert f"{bad / WEIGHTS}: tensor 'wte.weight' holds int32" in err
    assert not (tmp_path / "hf").exists() and not (tmp_path / "ft").exists()
    _retype(good, "wte.weight", torch.bfloat16)
    finetune = tiny_finetune(task, tmp_path / "vocab", tmp_path / "ft", 1)
    code, err = run_cli([*finetune, "--init", str(good)])
    assert code == 0, err


# ------------------------------------------------------------------------ writes stay inside
def _snapshot(root: Path, skip: Path) -> set[str]:
    """Every path under `root` except those inside `skip` (the run folder)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if d == skip or skip in d.parents:
            continue
        out.update(str(d / n) for n in dirnames + filenames if d / n != skip)
    return out


@pytest.mark.slow
def test_hostile_config_and_dataset_values_write_only_inside_the_run(tmp_path, monkeypatch):
    """Config values and dataset fields that look like paths (`../`, absolute names) end up as
    data, never as file names: a whole pretrain run, then fine-tune + predict on a dataset whose
    ids and texts are traversal attempts, leave every file they write inside the run folders."""
    from gpt1.cli import main

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    data = make_corpus(tmp_path / "data")
    # meta.json split names and a TOML whose string values are traversal attempts
    meta = json.loads((data / "meta.json").read_text())
    meta["splits"]["../../escape"] = meta["splits"]["val"]
    (data / "meta.json").write_text(json.dumps(meta))
    toml = tmp_path / "hostile.toml"
    toml.write_text(
        'preset = "tiny"\n[train]\nmax_steps = 2\nsave_every = 1\neval_every = 1\nlog_every = 1\n'
    )
    before = _snapshot(tmp_path, tmp_path / "run")
    assert (
        main(
            [
                "--quiet",
                "pretrain",
                "--config",
                str(toml),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "run"),
                "--set",
                "train.peak_flops=1",
            ]
        )
        == 0
    )
    assert _snapshot(tmp_path, tmp_path / "run") == before
    # fine-tune: a generic TSV task whose ids, texts and labels look like paths
    ft = tmp_path / "ft"
    ft.mkdir()
    rows = ["id\ttext\tlabel"] + [
        f"../../../../tmp/evil{i}\t/etc/passwd ../x{i}\t{'../a' if i % 2 else '/b'}"
        for i in range(8)
    ]
    for split in ("train", "dev", "test"):
        (ft / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    vocab = char_vocab(tmp_path / "vocab")
    before = _snapshot(tmp_path, tmp_path / "ftrun")
    task = ("--task", "tsv", "--columns", "text=text,label=label,id=id")
    assert main(["--quiet", *tiny_finetune(ft, vocab, tmp_path / "ftrun", 2, task=task)]) == 0
    assert main(["--quiet", "predict", str(tmp_path / "ftrun"), "--data", str(ft)]) == 0
    assert _snapshot(tmp_path, tmp_path / "ftrun") == before
    assert not list(Path("/tmp").glob("evil*"))
    sub = (tmp_path / "ftrun" / "submission" / "tsv.tsv").read_text().splitlines()
    assert sub[1].startswith("../../../../tmp/evil0\t")  # the id is written as data
    # a tampered task.json cannot redirect the submission file either
    task_file = tmp_path / "ftrun" / "final" / "task.json"
    record = json.loads(task_file.read_text())
    record["task"] = "../../escaped"
    task_file.write_text(json.dumps(record))
    with pytest.raises(Gpt1Error):
        from gpt1.recipes.evaluate import ScoringOptions, predict_run

        predict_run(ScoringOptions(tmp_path / "ftrun", data=str(ft)))
    assert _snapshot(tmp_path, tmp_path / "ftrun") == before


@pytest.mark.parametrize("kind", ["pickle", "torch-zip"])
def test_convert_from_hf_refuses_a_crafted_bin_in_one_line_of_its_own(tmp_path, capsys, kind):
    """The refusal is gpt1's one line: torch's own message (six lines advising
    `weights_only=False`, i.e. running the file's code) is never shown."""
    from gpt1.cli import main
    from gpt1.recipes.convert import save_hf

    hf = save_hf(GPT(model_preset("tiny")), tmp_path / "hf")
    (hf / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    # As large as the weights the config implies, so the size check does not refuse it first.
    crafted = {"pad": torch.zeros(100_000), "wte.weight": _Payload(marker)}
    if kind == "pickle":
        crafted["pad"] = b"\0" * 400_000
        (hf / "pytorch_model.bin").write_bytes(pickle.dumps(crafted, protocol=2))
    else:
        torch.save(crafted, hf / "pytorch_model.bin")
    code = main(["--quiet", "convert", str(hf), str(tmp_path / "out"), "--from", "hf"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(hf / "pytorch_model.bin") in err and "refused" in err
    assert "weights_only" not in err and "trust" in err
    assert not marker.exists() and not (tmp_path / "out").exists()
