"""The lm-evaluation-harness adapter: its numbers are gpt1's, and the harness runs it end to end."""

from __future__ import annotations

import math

import pytest
import torch

from gpt1 import GPT, ModelConfig, save_model

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from gpt1.recipes.harness import Gpt1LM  # noqa: E402

TINY = dict(vocab_size=40478, n_positions=48, n_embd=32, n_layer=2, n_head=2)
ONE_TOKEN_WORDS = ["the", "man", "said", "that", "he", "was", "not", "here", "and", "she"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, request):
    from conftest import SHARED_DATA

    vocab = SHARED_DATA / "gpt1_tokenizer"
    if not vocab.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY))
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
    from gpt1.zeroshot.scorer import Scorer

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
