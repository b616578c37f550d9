"""Speculative decoding with drafts from the text: greedy tokens equal plain decoding's, sampled
tokens follow plain sampling's distribution, drafts and their pace behave as documented."""

import pytest
import torch
from conftest import TINY_MODEL

from gpt1 import GPT, ModelConfig
from gpt1.inference.decoding import KVCache, forward_cached
from gpt1.inference.generate import generate_stream
from gpt1.inference.sampling import Sampling
from gpt1.inference.speculative import (
    HOPELESS_PAUSE,
    MAX_DRAFT,
    TIMED_PASSES,
    Costs,
    Drafter,
    Drafts,
    Pace,
    Speculator,
    accept,
    costs_of,
)

# A window (40) the prompts and new tokens run past, and a vocabulary (89) no other size has.
MODEL = {**TINY_MODEL, "vocab_size": 89, "n_positions": 40}


PLAIN_STEP = Costs.plain_step  # the one `untimed` replaces


@pytest.fixture(autouse=True)
def untimed(monkeypatch):
    """Drafting as if passes always paid: how fast this machine runs a tiny model's passes
    (which cannot pay, `Costs.hopeless`) must not decide what these tests exercise. Pacing by
    time has tests of its own, which give the times."""
    monkeypatch.setattr(Costs, "plain_step", lambda self, seconds: None)


def model(seed: int = 0, scale: float = 0.2) -> GPT:
    torch.manual_seed(seed)
    m = GPT(ModelConfig(**MODEL))
    with torch.no_grad():  # larger weights than the 0.02 init, so greedy paths are not flat
        for p in m.parameters():
            p.add_(torch.randn_like(p) * scale)
    return m.eval()


def prompts() -> list[list[int]]:
    """Random prompts, and repetitive ones (a phrase repeated, a passage to continue)."""
    g = torch.Generator().manual_seed(3)
    found = [torch.randint(0, 89, (n,), generator=g).tolist() for n in (1, 2, 5, 9, 17)]
    phrase = torch.randint(0, 89, (6,), generator=g).tolist()
    return [*found, phrase * 3, phrase * 5 + phrase[:2], [7, 7, 7, 7], [1, 2, 3, 1, 2]]


def tokens(m: GPT, prompt: list[int], sampling: Sampling, spec=None, **kw) -> list[int]:
    ids = torch.tensor([prompt])
    return [int(t) for t in generate_stream(m, ids, sampling, speculator=spec, **kw)]


def test_drafter_proposes_what_followed_the_longest_recent_run():
    d = Drafter([5, 6, 7, 8, 1, 6, 7, 9, 2])
    assert d.draft(3) == []  # 2 never occurred before
    d.extend([6, 7])
    assert d.draft(3) == [9, 2, 6]  # "6 7" last ended before 9 (not the older "6 7 8")
    assert d.draft(6) == [9, 2, 6, 7, 9, 2]  # past the end: "9 2 6 7" goes on repeating
    d.extend([8])
    assert d.draft(2) == [1, 6]  # "6 7 8" (3 tokens) beats "7 8" and "8"
    assert d.draft(0) == []
    loop = Drafter([4, 4])
    assert loop.draft(5) == [4, 4, 4, 4, 4]  # a loop of one token


def test_pace_grows_on_acceptance_shrinks_on_rejection_and_pauses():
    pace = Pace()
    assert pace.length() == 2
    pace.update(2, 2)
    pace.update(4, 4)
    pace.update(MAX_DRAFT, MAX_DRAFT)
    assert pace.length() == MAX_DRAFT
    pace.update(MAX_DRAFT, 2)
    assert pace.length() == 3
    pace.update(3, 0)  # nothing accepted: pause 2 tokens, then drafts of 1
    assert [pace.length() for _ in range(3)] == [0, 0, 1]
    pace.update(1, 0)
    assert [pace.length() for _ in range(5)] == [0, 0, 0, 0, 1]
    for _ in range(20):  # drafts that keep failing: pauses of at most 64 tokens
        pace.update(1, 0)
    assert pace.pause == 64
    costs = Costs()
    costs.step_seconds = 0.010  # a plain step takes 10 ms
    timed = Pace(costs)
    timed.update(4, 1, seconds=0.015)  # 2 tokens in 15 ms: paid
    assert timed.pause == 0 and timed.k == 2
    timed.update(2, 1, seconds=0.035)  # 2 tokens in 35 ms: one slow pass, the average pays
    assert timed.pause == 0
    timed.update(2, 1, seconds=0.035)  # passes that keep costing more: a miss
    assert timed.pause == 2 and not costs.hopeless()


def test_a_model_whose_passes_cannot_pay_stops_drafting():
    """Passes of k drafts that cost more than k + 1 plain steps (timed `TIMED_PASSES` times, a
    draft length's first pass not counted): drafting stops for `HOPELESS_PAUSE` tokens, in
    this generation and the model's next ones."""
    costs = Costs()
    PLAIN_STEP(costs, 0.001)
    pace = Pace(costs)
    pace.update(2, 2, seconds=0.5)  # the first pass of 3 rows: not timed
    assert costs.passes == 0
    pace.update(2, 2, seconds=0.004)  # 3 tokens in 4 plain steps' time
    assert pace.pause == 2 and not costs.hopeless()  # not paid: a short pause
    for _ in range(TIMED_PASSES - 1):
        assert not costs.hopeless()
        pace.update(2, 2, seconds=0.004)
    assert costs.hopeless() and pace.pause == HOPELESS_PAUSE
    assert Pace(costs).pause == HOPELESS_PAUSE
    m = model()
    assert costs_of(m) is costs_of(m) and costs_of(m) is not costs_of(model())


def test_truncate_drops_rejected_positions_and_the_next_pass_overwrites_them():
    m = model()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    whole = m(ids)
    with torch.no_grad():
        cache = KVCache(m.config.n_layer)
        forward_cached(m, ids[:, :4], cache)
        forward_cached(m, torch.tensor([[80, 81, 82]]), cache)  # a draft, rejected
        cache.truncate(4)
        again = forward_cached(m, ids[:, 4:], cache)
    torch.testing.assert_close(again, whole[:, 4:], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        cache.truncate(9)


@pytest.mark.parametrize("window", [None, 24])
def test_greedy_speculation_gives_plain_decodings_tokens(window):
    """fp32, prompts random and repetitive, past the window (where speculation stops and each
    token re-reads the window): the same tokens, with drafts accepted on the way."""
    m, greedy, counts = model(), Sampling(max_new_tokens=60, temperature=0.0), Drafts()
    for prompt in prompts():
        plain = tokens(m, prompt, greedy, window=window)
        fast = tokens(m, prompt, greedy, Speculator(prompt, counts), window=window)
        assert fast == plain, prompt
    assert 0 < counts.accepted < counts.drafted


def test_accept_draws_the_target_distribution():
    """One position, a point-mass draft: the token is x with probability p(x), any other y
    with p(y), for drafts likely and unlikely, with top-k filtering (p is the filtered one)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]])  # [1, V]: the token after `last`
    sampling = Sampling(max_new_tokens=1, temperature=0.8, top_k=4, seed=0)
    g = sampling.generator()
    p = (logits / 0.8).masked_fill(logits < 0.5, float("-inf")).softmax(-1)[0]
    n = 20_000
    for draft in (5, 1, 4):  # the likeliest, a likely one, one top-k removes
        counts = torch.zeros(6)
        for _ in range(n):
            counts[accept(logits[:, :], [draft], sampling, g)[0]] += 1
        assert (counts / n - p).abs().max() < 0.015, (draft, counts / n, p)


def _continuations(m, prompt, sampling, speculate: bool, runs: int) -> tuple[dict, Drafts]:
    seen: dict[tuple, int] = {}
    g = torch.Generator().manual_seed(11 if speculate else 12)
    counts = Drafts()
    for _ in range(runs):
        spec = Speculator(prompt, counts) if speculate else None
        got = tuple(
            int(t) for t in generate_stream(m, torch.tensor([prompt]), sampling, g, speculator=spec)
        )
        seen[got] = seen.get(got, 0) + 1
    return seen, counts


def _chi_square(plain: dict[tuple, int], spec: dict[tuple, int]) -> float:
    """The p-value of two tables of outcomes coming from one distribution (outcomes seen fewer
    than 10 times together pooled into one)."""
    stats = pytest.importorskip("scipy.stats")
    keys = [k for k in plain.keys() | spec.keys() if plain.get(k, 0) + spec.get(k, 0) >= 10]
    assert len(keys) >= 5
    table = [
        [t.get(k, 0) for k in keys] + [sum(t.values()) - sum(t.get(k, 0) for k in keys)]
        for t in (plain, spec)
    ]
    return float(stats.chi2_contingency(table).pvalue)


def test_sampled_speculation_follows_plain_sampling_in_distribution(monkeypatch):
    """The next 3 tokens of a text in the model's own loop (drafts from the first verified step
    on), sampled 1500 times each way: a chi-square test does not tell the two apart, where it
    tells at once a rule that accepts every draft (the mistake this guards against)."""
    from gpt1.inference import speculative

    m = model(seed=1, scale=0.35)
    start = [4, 9, 2]
    prompt = start + tokens(m, start, Sampling(max_new_tokens=12, temperature=0.0))
    sampling = Sampling(max_new_tokens=3, temperature=0.7, top_p=0.95)
    plain, _ = _continuations(m, prompt, sampling, False, 1500)
    spec, counts = _continuations(m, prompt, sampling, True, 1500)
    assert 0 < counts.accepted < counts.drafted  # both outcomes were exercised
    assert _chi_square(plain, spec) > 1e-3

    rule = speculative.accept

    def accept_all(logits, draft, sampling, generator, vocab=None):
        return draft + rule(logits[len(draft) :], [], sampling, generator)

    monkeypatch.setattr(speculative, "accept", accept_all)
    assert _chi_square(plain, _continuations(m, prompt, sampling, True, 1500)[0]) < 1e-3


def test_gpt1_sample_speculates_when_greedy_and_says_how_many_drafts_it_accepted(tmp_path):
    """`gpt1 sample`: greedy by default and sampled with --speculate on, the closing line counts
    the drafts; --speculate off (and a sampled run by default) drafts nothing and gives the
    same text; a mode it does not know is refused."""
    import contextlib
    import io

    from gpt1.cli import main
    from helpers.tiny import run_cli, tiny_checkpoint

    folder = tiny_checkpoint(tmp_path / "run" / "final")
    argv = ["sample", str(folder), "--prompt-ids", "5 6 7 5 6 7 5 6", "--max-new-tokens", "30"]

    def answer(*flags: str) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            assert main([*argv, *flags]) == 0
        return out.getvalue(), err.getvalue().splitlines()[-1]

    text, line = answer("--temperature", "0")
    assert "tokens/s); drafts accepted: " in line
    plain, plain_line = answer("--temperature", "0", "--speculate", "off")
    assert plain == text and "drafts" not in plain_line
    assert "drafts accepted" not in answer("--seed", "1")[1]
    assert "drafts accepted" in answer("--seed", "1", "--speculate", "on")[1]
    assert run_cli([*argv, "--speculate", "maybe"])[0] == 2


def test_batched_decoder_speculates_for_a_lone_generation_only():
    """A greedy generation alone takes drafts and gives plain decoding's tokens; joined by a
    second one, the two share steps without drafts (and keep their tokens); --speculate off
    drafts nothing; a sampled generation drafts with "on" only."""
    from gpt1.inference.batched import BatchedDecoder

    m = model()
    prompt = [1, 2, 3, 1, 2]
    greedy = Sampling(max_new_tokens=30, temperature=0.0)
    want = tokens(m, prompt, greedy)

    def run(decoder: BatchedDecoder, *gens) -> list[list[int]]:
        out = {gen: [] for gen in gens}
        while decoder.active:
            for gen, item in decoder.step():
                assert not isinstance(item, Exception), item
                if item is not None:
                    out[gen].append(item)
        return list(out.values())

    alone = BatchedDecoder(m)
    assert run(alone, alone.add(prompt, greedy)) == [want]
    assert 0 < alone.drafts.accepted <= alone.drafts.drafted
    pair = BatchedDecoder(m)
    other = prompts()[3]
    got = run(pair, pair.add(prompt, greedy), pair.add(other, greedy))
    assert got == [want, tokens(m, other, greedy)] and pair.drafts.drafted == 0
    off = BatchedDecoder(m, speculate="off")
    assert run(off, off.add(prompt, greedy)) == [want] and off.drafts.drafted == 0
    sampled = Sampling(max_new_tokens=30, temperature=0.5, seed=3)
    auto, on = BatchedDecoder(m), BatchedDecoder(m, speculate="on")
    assert run(auto, auto.add(prompt, sampled)) == [tokens(m, prompt, sampled)]
    assert auto.drafts.drafted == 0
    run(on, on.add(prompt, sampled))
    assert on.drafts.drafted > 0


def test_server_counts_drafts_in_metrics_and_keeps_greedy_text(tmp_path):
    """/v1/completions and /v1/generate, greedy: `gpt1 sample --speculate off`'s text, and
    /metrics counts the drafted and accepted tokens."""
    import httpx
    from test_serve import TIMEOUT, post, serving, tiny_lm

    from gpt1.recipes.sample import Sampler
    from helpers.tiny import char_vocab

    lm = tiny_lm(tmp_path / "lm", char_vocab(tmp_path / "vocab"))
    prompt = "the old man and the old man and the old"
    sampler = Sampler(lm, "cpu", "auto", speculate="off")
    greedy = Sampling(max_new_tokens=20, temperature=0.0)
    want = "".join(sampler.stream(sampler.prompt_ids(prompt), greedy))
    with serving(lm) as url:
        body = {"prompt": prompt, "max_tokens": 20, "temperature": 0}
        completion = post(f"{url}/v1/completions", body).json()
        body = {"prompt": prompt, "max_new_tokens": 20, "temperature": 0}
        generated = post(f"{url}/v1/generate", body).json()
        metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    assert generated["text"] == want
    assert completion["choices"][0]["text"].strip() == want.strip()
    counts = dict(
        line.split(" ") for line in metrics.splitlines() if line.startswith("gpt1_draft_")
    )
    assert (
        0 < float(counts["gpt1_draft_accepted_total"]) <= float(counts["gpt1_draft_tokens_total"])
    )
