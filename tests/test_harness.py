"""The lm-evaluation-harness adapter: its numbers are gpt1's, and the harness runs it end to end."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from gpt1 import GPT, ModelConfig, save_model

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from gpt1.lm_eval.adapter import Gpt1LM  # noqa: E402
from helpers.tiny import BPE_VOCAB_MODEL  # noqa: E402

ONE_TOKEN_WORDS = ["the", "man", "said", "that", "he", "was", "not", "here", "and", "she"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, request):
    from conftest import SHARED_DATA

    vocab = SHARED_DATA / "gpt1_tokenizer"
    if not vocab.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    torch.manual_seed(0)
    model = GPT(ModelConfig(**BPE_VOCAB_MODEL))
    with torch.no_grad():  # larger weights than the init, so greedy paths are not flat
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return save_model(model, tmp_path_factory.mktemp("harness") / "ck", tokenizer_dir=vocab)


@pytest.fixture(scope="module")
def lm(checkpoint) -> Gpt1LM:
    return Gpt1LM(
        checkpoint=str(checkpoint), device="cpu", precision="fp32", batch_tokens=64, max_rows=3
    )


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def direct_logprob(model: GPT, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """The plain way: one unpadded row, full logits, log-softmax, gather."""
    row = torch.tensor([ctx + cont[:-1]])
    with torch.no_grad():
        logp = torch.log_softmax(model.lm_logits(model(row)).float(), -1)[0, len(ctx) - 1 :]
    targets = torch.tensor(cont)
    total = float(logp[torch.arange(len(cont)), targets].sum())
    return total, bool((logp.argmax(-1) == targets).all())


PAIRS = [
    ("the old man looked at the sea", " and"),
    ("she said that", " he was not here"),
    ("It's 3.5 miles, isn't it?", " Yes."),
    ("the old man looked at the sea", " and smiled"),
    ("", "hello there"),
]


def test_loglikelihood_equals_the_scorer_and_a_direct_computation(lm):
    from gpt1.inference.scoring import Scorer

    got = lm.loglikelihood(requests("loglikelihood", PAIRS))
    encoded = [
        ([lm.prefix_token_id], lm.tok_encode(c)) if not a else lm._encode_pair(a, c)
        for a, c in PAIRS
    ]
    scorer = [(s.total, s.greedy) for s in Scorer(lm.model).score(encoded, greedy=True)]
    for (total, greedy), (s_total, s_greedy), (ctx, cont) in zip(got, scorer, encoded):
        d_total, d_greedy = direct_logprob(lm.model, ctx, cont)
        assert total == pytest.approx(s_total, abs=1e-6) and greedy == s_greedy
        assert total == pytest.approx(d_total, abs=1e-4) and greedy == d_greedy
    assert len({round(t, 4) for t, _ in got}) == len(got)  # distinct requests, distinct numbers
    # a pretrained LM's prefix is <unk>, the start token the transformers export declares
    assert lm.prefix_token_id == lm.tok.unk_id == 0
    # the greedy flag is true for a continuation made of the argmax token
    ctx = lm.tok_encode("the old man")
    with torch.no_grad():
        best = int(lm.model.lm_logits(lm.model(torch.tensor([ctx])))[0, -1].argmax())
    ((_, greedy),) = lm._loglikelihood_tokens([(None, ctx, [best])])
    assert greedy is True


def window_losses(model: GPT, windows: list[list[int]]) -> float:
    """-sum of log-probabilities as the LM loss sees windows: mean cross-entropy x targets."""
    from gpt1.train.objectives import lm_loss_window

    total = 0.0
    for seq in windows:
        ids = torch.tensor([seq])
        with torch.no_grad():
            loss = lm_loss_window(model, model(ids[:, :-1]), ids[:, 1:])
        total += float(loss) * (len(seq) - 1)
    return -total


def test_loglikelihood_rolling_equals_the_lm_loss_over_windows(checkpoint):
    lm = Gpt1LM(checkpoint=str(checkpoint), device="cpu", precision="fp32", max_length=12)
    long_text = " ".join(ONE_TOKEN_WORDS[i % 10] for i in range(36))
    ids = lm.tok_encode(long_text)
    assert len(ids) == 36  # one token a word: three windows of 12
    short_text = "the man said that"
    short = lm.tok_encode(short_text)
    p = lm.prefix_token_id
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(long_text,), (short_text,)]))
    # window 1: the prefix token then 12 tokens; windows 2 and 3: 12 tokens of context each
    expected_long = window_losses(lm.model, [[p] + ids[:12], ids[11:24], ids[23:36]])
    assert got[0] == pytest.approx(expected_long, abs=1e-3)
    assert got[1] == pytest.approx(window_losses(lm.model, [[p] + short]), abs=1e-4)
    assert lm.max_length == 12


def sample_cli(checkpoint, prompt: str, n: int, capsys) -> str:
    from gpt1.cli import main

    assert (
        main(
            [
                "sample",
                str(checkpoint),
                "--prompt",
                prompt,
                "--temperature",
                "0",
                "--max-new-tokens",
                str(n),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    return capsys.readouterr().out.strip()


def test_generate_until_greedy_equals_gpt1_sample_and_honours_stop_strings(lm, checkpoint, capsys):
    prompt = "the old man looked at the sea"
    printed = sample_cli(checkpoint, prompt, 12, capsys)
    (text,) = lm.generate_until(requests("generate_until", [(prompt, {"max_gen_toks": 12})]))
    assert printed == f"{prompt} {text}".strip()
    words = text.split()
    assert len(words) >= 3
    stop = " " + words[2]
    cut = text.index(stop)
    (stopped,) = lm.generate_until(
        requests("generate_until", [(prompt, {"max_gen_toks": 12, "until": [stop, "\u2603"]})])
    )
    assert stopped == text[:cut]
    # a stop string that never appears leaves the whole continuation
    (whole,) = lm.generate_until(
        requests("generate_until", [(prompt, {"max_gen_toks": 12, "until": ["\u2603"]})])
    )
    assert whole == text


def test_harness_runs_a_local_task_end_to_end(lm, checkpoint, shared_data):
    from gpt1.recipes.harness import simple_evaluate
    from gpt1.zeroshot.data import read_lambada

    results = simple_evaluate(
        str(checkpoint),
        ["gpt1_lambada"],
        data=str(shared_data),
        limit=4,
        device="cpu",
        precision="fp32",
    )
    metrics = results["results"]["gpt1_lambada"]
    # the same passages through the adapter by hand
    passages = read_lambada(shared_data / "corpus" / "lambada")[:4]
    scored = lm.loglikelihood(requests("loglikelihood", [(c, " " + w) for c, w in passages]))
    assert metrics["perplexity,none"] == pytest.approx(
        math.exp(-sum(t for t, _ in scored) / 4), rel=1e-6
    )
    assert metrics["acc,none"] == pytest.approx(sum(g for _, g in scored) / 4)
    assert results["config"]["model"] == "gpt1"


def test_cli_hands_options_to_the_harness(checkpoint, shared_data, capsys):
    from gpt1.cli import main

    rc = main(
        [
            "lm-eval",
            "--model_args",
            f"checkpoint={checkpoint},precision=fp32",
            "--tasks",
            "gpt1_sst2,gpt1_story_cloze",
            "--data",
            str(shared_data),
            "--limit",
            "3",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "gpt1_sst2" in out and "gpt1_story_cloze" in out and "acc_norm" in out


def test_local_tasks_say_where_the_data_must_come_from(checkpoint):
    from gpt1.errors import DataError
    from gpt1.recipes.harness import simple_evaluate

    with pytest.raises(DataError, match="--data"):
        simple_evaluate(str(checkpoint), ["gpt1_lambada"], limit=1, device="cpu")


# -- the command's checks: one line, exit 2, before anything is evaluated ----------------------
def lm_eval_cli(argv: list[str], capsys) -> tuple[int, str]:
    from gpt1.cli import main

    code = main(["--quiet", "lm-eval", *argv])
    err = [line for line in capsys.readouterr().err.splitlines() if "--limit SHOULD" not in line]
    return code, "\n".join(err)


@pytest.mark.parametrize(
    "model_args,says",
    [
        (None, "checkpoint=DIR is required"),
        ("precision=fp32", "checkpoint=DIR is required"),
        ("max_length=-5", "max_length must be an integer 1..48"),
        ("max_length=abc", "max_length must be an integer 1..48"),
        ("max_length=0", "max_length must be an integer 1..48"),
        ("max_length=1000000000", "max_length must be an integer 1..48"),
        ("max_length=2.5", "max_length must be an integer 1..48"),
        ("batch_tokens=0", "batch_tokens must be an integer >= 1"),
        ("max_rows=-1", "max_rows must be an integer >= 1"),
        ("prefix_token_id=40478", "prefix_token_id must be an integer 0..40477"),
    ],
)
def test_bad_model_args_are_one_line(checkpoint, shared_data, capsys, model_args, says):
    argv = ["--tasks", "gpt1_sst2", "--data", str(shared_data), "--limit", "1"]
    if model_args is not None:
        first = "" if model_args.startswith("precision") else f"checkpoint={checkpoint},"
        argv += ["--model_args", first + model_args]
    code, err = lm_eval_cli(argv, capsys)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv,says",
    [
        ([], "checkpoint=DIR is required"),
        (["--tasks", "gpt1_nosuch"], "Tasks not found: gpt1_nosuch"),
        (["--tasks", "gpt1_sst2,gpt1_nosuch"], "Tasks not found: gpt1_nosuch"),
        (["--limit", "1"], "--tasks is required"),
    ],
)
def test_missing_or_unknown_tasks_are_one_line(checkpoint, shared_data, capsys, argv, says):
    if argv:
        argv = ["--model_args", f"checkpoint={checkpoint}", "--data", str(shared_data), *argv]
    code, err = lm_eval_cli(argv, capsys)
    assert code == 2 and says in err and len(err.splitlines()) == 1, err


def test_results_land_in_a_folder_named_after_the_checkpoint(
    checkpoint, shared_data, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(checkpoint.parent)
    argv = ["--tasks", "gpt1_sst2", "--data", str(shared_data), "--limit", "1"]
    code, _ = lm_eval_cli(
        ["--model_args", f"checkpoint={checkpoint.name}", *argv, "--output_path", str(tmp_path)],
        capsys,
    )
    assert code == 0
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.name]
    assert len(list((tmp_path / checkpoint.name).glob("results_*.json"))) == 1


@pytest.mark.parametrize("target", ["folder", "file.json"])
def test_an_unwritable_output_path_is_refused_before_evaluating(
    checkpoint, shared_data, capsys, tmp_path, monkeypatch, target
):
    """Where the results cannot be written, the command stops before evaluating (simulated with
    a probe that fails as a read-only mount does; tests/test_faults.py runs a real one)."""
    import errno

    from gpt1.recipes import harness

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    evaluated = []
    monkeypatch.setattr(harness.tempfile, "mkstemp", read_only)
    monkeypatch.setattr(Gpt1LM, "__init__", lambda *a, **k: evaluated.append(1))
    code, err = lm_eval_cli(
        [
            "--model_args",
            f"checkpoint={checkpoint}",
            "--tasks",
            "gpt1_sst2",
            "--data",
            str(shared_data),
            "--output_path",
            str(tmp_path / "out" / target),
        ],
        capsys,
    )
    assert code == 2 and "Read-only file system; needs a writable folder" in err, err
    assert len(err.splitlines()) == 1 and not evaluated
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_results_the_harness_could_not_save_fail_the_command(
    checkpoint, shared_data, capsys, tmp_path, monkeypatch
):
    """A failure only at the end (a disk that fills up) is not success: the harness only warns."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    monkeypatch.setattr(EvaluationTracker, "save_results_aggregated", lambda *a, **k: None)
    argv = ["--tasks", "gpt1_sst2", "--data", str(shared_data), "--limit", "1"]
    code, err = lm_eval_cli(
        ["--model_args", f"checkpoint={checkpoint}", *argv, "--output_path", str(tmp_path)],
        capsys,
    )
    assert code == 2 and "could not save the results" in err.splitlines()[-1]


def hub_only_task(folder: Path) -> Path:
    """A harness task definition whose data lives on the Hugging Face Hub only."""
    (folder / "gpt1_hub_only.yaml").write_text(
        "task: gpt1_hub_only\n"
        "dataset_path: nosuch-org/nosuch-dataset\n"
        "output_type: multiple_choice\n"
        "test_split: test\n"
        'doc_to_text: "{{question}}"\n'
        "doc_to_target: 0\n"
        'doc_to_choice: ["yes", "no"]\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return folder


@pytest.mark.parametrize(
    "failure",
    [
        ConnectionError("Couldn't reach 'nosuch-org/nosuch-dataset' on the Hub (ConnectError)"),
        TimeoutError("timed out"),
    ],
)
def test_a_hub_task_whose_download_fails_is_one_line(
    checkpoint, tmp_path, capsys, monkeypatch, failure
):
    import datasets

    def unreachable(*args, **kwargs):
        raise failure

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    argv = ["--tasks", "gpt1_hub_only", "--include_path", str(hub_only_task(tmp_path))]
    code, err = lm_eval_cli(["--model_args", f"checkpoint={checkpoint}", *argv], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "'gpt1_hub_only'" in err and "could not be reached" in err


@pytest.mark.slow
def test_a_hub_task_offline_is_one_line(checkpoint, tmp_path):
    """The same through `python -m gpt1` with the Hub really unreachable (forced offline, as on
    a machine without a network): one line naming the task, exit 2."""
    import os
    import subprocess
    import sys

    from conftest import subprocess_env

    hub_only_task(tmp_path)
    env = {**subprocess_env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gpt1", "--quiet", "lm-eval", "--model_args"]
        + [f"checkpoint={checkpoint}", "--tasks", "gpt1_hub_only"]
        + ["--include_path", str(tmp_path), "--limit", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.getcwd(),
    )
    err = [
        line
        for line in done.stderr.splitlines()
        if "--limit SHOULD" not in line and not line.startswith("threads: ")
    ]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(err) == 1 and "'gpt1_hub_only'" in err[0] and "Hugging Face Hub" in err[0]


@pytest.mark.parametrize(
    "tasks, probed", [("hellaswag", True), ("gpt1_sst2,arc_easy", True), ("gpt1_zeroshot", False)]
)
def test_an_unreachable_hub_puts_the_harness_offline_before_it_loads(monkeypatch, tasks, probed):
    """Asked for the harness's own tasks with the Hub unreachable, the command sets the hub
    libraries' offline mode before they load (cached data used, the rest fails at once: it
    retried for half a minute); gpt1's local tasks never probe; a reachable Hub changes nothing."""
    import socket

    from gpt1.cli import lm_eval

    calls = []

    def unreachable(address, timeout):
        calls.append(address)
        raise OSError("Name or service not known")

    # A copy of the environment: what the command sets must not reach the other tests.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if "OFFLINE" not in k})
    monkeypatch.setattr(socket, "create_connection", unreachable)
    lm_eval.offline_unless_hub_reachable(["--model_args", "checkpoint=x", "--tasks", tasks])
    assert bool(calls) == probed
    assert (os.environ.get("HF_HUB_OFFLINE") == "1") == probed
    assert (os.environ.get("HF_DATASETS_OFFLINE") == "1") == probed
