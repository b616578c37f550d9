"""Continuous batching (`gpt1.inference.decoding.decode`, `gpt1.inference.batched.BatchedDecoder`) gives what
`generate_stream` gives each sequence alone: the same hidden states up to summation order, the
same greedy and seeded tokens, joining and leaving at any step, past the context too."""

import pytest
import torch

from gpt1 import GPT, ModelConfig
from gpt1.errors import ConfigError
from gpt1.inference.batched import BatchedDecoder
from gpt1.inference.decoding import KVCache, decode, forward_cached
from gpt1.inference.generate import generate
from gpt1.inference.prepack import prepack_for_inference
from gpt1.inference.sampling import Sampling


def greedy(n: int) -> Sampling:
    return Sampling(max_new_tokens=n, temperature=0)


def _model(prepacked: bool = False) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=40, n_embd=64, n_layer=2, n_head=4)
    model = GPT(config).eval()
    return prepack_for_inference(model) if prepacked else model


def _run(decoder: BatchedDecoder, starts: dict[int, list[tuple]]) -> dict[int, list[int]]:
    """Step until every generation ends; `starts[step]` lists (key, `add`'s arguments) begun
    before it."""
    keys, out = {}, {}
    step = 0
    while decoder.active or any(s >= step for s in starts):
        for key, args in starts.get(step, []):
            keys[decoder.add(*args)] = key
            out[key] = []
        for gen, item in decoder.step():
            assert not isinstance(item, Exception), item
            if item is not None:
                out[keys[gen]].append(item)
        step += 1
    return out


def test_decode_equals_forward_with_a_cache_for_each_sequence():
    model = _model()
    prompts = [torch.randint(0, 300, (1, n)) for n in (5, 1, 17)]
    nxt = torch.randint(0, 300, (3,))
    caches = [KVCache(2, 40) for _ in prompts]
    alone = [KVCache(2, 40) for _ in prompts]
    with torch.no_grad():
        for p, c, a in zip(prompts, caches, alone):
            forward_cached(model, p, c)
            forward_cached(model, p, a)
        together = decode(model, nxt, caches)  # [3, C]
        for r in range(3):
            want = forward_cached(model, nxt[r].view(1, 1), alone[r])[0, -1]
            torch.testing.assert_close(together[r], want, rtol=1e-5, atol=1e-5)
    assert [len(c) for c in caches] == [6, 2, 18]


@pytest.mark.parametrize("prepacked", [False, True])
def test_generations_decoded_together_equal_each_alone(prepacked):
    """Two start together, two join at step 2 (one runs past the 40-position context)."""
    model = _model(prepacked)
    prompts = [torch.randint(0, 300, (n,)).tolist() for n in (3, 7, 1, 12)]
    news = [10, 20, 45, 5]
    want = [
        generate(model, torch.tensor([p]), k, temperature=0)[0, len(p) :].tolist()
        for p, k in zip(prompts, news)
    ]
    starts = {
        0: [(i, (prompts[i], greedy(news[i]))) for i in (0, 1)],
        2: [(i, (prompts[i], greedy(news[i]))) for i in (2, 3)],
    }
    got = _run(BatchedDecoder(model), starts)
    assert [got[i] for i in range(4)] == want


def test_a_lone_generation_is_generate_stream_bit_for_bit():
    model = _model(prepacked=True)
    prompt = torch.randint(0, 300, (6,)).tolist()
    want = generate(model, torch.tensor([prompt]), 25, temperature=0)[0, 6:].tolist()
    assert _run(BatchedDecoder(model), {0: [(0, (prompt, greedy(25)))]})[0] == want


def test_seeded_sampling_follows_each_generations_own_generator():
    model = _model()
    prompts = [[5, 6, 7], [9]]
    opts = {"temperature": 0.9, "top_k": 50, "top_p": 0.95}
    want = [
        generate(model, torch.tensor([p]), 15, generator=torch.Generator().manual_seed(s), **opts)[
            0, len(p) :
        ].tolist()
        for p, s in zip(prompts, (1, 2))
    ]
    sampling = Sampling(max_new_tokens=15, **opts)
    starts = {
        0: [
            (i, (prompts[i], sampling, torch.Generator().manual_seed(s)))
            for i, s in ((0, 1), (1, 2))
        ]
    }
    got = _run(BatchedDecoder(model), starts)
    assert [got[0], got[1]] == want


def test_generations_with_mixed_options_get_the_tokens_each_gets_alone():
    """Greedy and sampled generations decoded together, each with its own generator, get the
    tokens each gets alone: options shared and not, a temperature so small that its logits
    overflow, temperatures alone (drawn together in one call where the kernel is built), and
    generations joining later."""
    model = _model()
    prompts = [[5, 6, 7], [9], [1, 2], [3, 4, 5, 6], [8], [2, 2], [4], [7, 1], [6, 6, 6]]
    options = [
        {"temperature": 0.9, "top_k": 50},
        {"temperature": 0.9, "top_k": 50},
        {"temperature": 1e-30},
        {"temperature": 1e-30},
        {"temperature": 0.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 0.8},
        {"temperature": 1.3},
        {"temperature": 1.0, "top_k": 10_000},  # a filter that keeps every id
    ]
    want = [
        generate(model, torch.tensor([p]), 12, generator=torch.Generator().manual_seed(s), **o)[
            0, len(p) :
        ].tolist()
        for s, (p, o) in enumerate(zip(prompts, options))
    ]
    starts: dict[int, list[tuple]] = {0: [], 2: []}
    for s, (p, o) in enumerate(zip(prompts, options)):
        args = (p, Sampling(max_new_tokens=12, **o), torch.Generator().manual_seed(s))
        starts[0 if s < 4 else 2].append((s, args))
    got = _run(BatchedDecoder(model, speculate="off"), starts)
    assert [got[s] for s in range(len(prompts))] == want


def test_each_row_of_a_batch_is_filtered_as_it_is_alone():
    """A temperature that makes one row overflow and not another: each row's filtered logits
    are those it gets alone (the overflow's fallback applies to that row only)."""
    from gpt1.inference.generate import filter_logits

    logits = torch.tensor([[0.0, 0.0, -0.0], [3.0, 1.0, 2.0], [1e-3, 2e-3, 0.0]])
    sampling = Sampling(temperature=1e-39, top_k=2)
    together = filter_logits(logits, sampling)
    alone = torch.cat([filter_logits(row[None], sampling) for row in logits])
    assert torch.equal(together, alone)
    assert torch.isfinite(together[1]).tolist() == [True, False, False]  # its limit: the largest
    assert torch.isfinite(together[2]).sum() == 2  # a row that did not overflow: its top 2


def test_stop_and_finish_events_and_checks():
    model = _model()
    decoder = BatchedDecoder(model)
    a = decoder.add([1, 2], greedy(3))
    b = decoder.add([3], greedy(0))  # asks for nothing: finished at once
    first = decoder.step()
    assert (b, None) in first and sum(1 for g, t in first if g is a and isinstance(t, int)) == 1
    decoder.stop(a)
    assert decoder.active == [] and decoder.step() == []
    c = decoder.add([4], greedy(1))
    events = decoder.step()
    assert [g for g, _ in events] == [c, c] and events[-1][1] is None  # last token, then None
    with pytest.raises(ConfigError):
        decoder.add([], Sampling(max_new_tokens=3))
    with pytest.raises(ConfigError):
        decoder.add([300], Sampling(max_new_tokens=3))
    with pytest.raises(ConfigError):
        decoder.add([1], Sampling(max_new_tokens=3, temperature=-1))


def test_the_pool_grows_once_to_what_its_generations_ask_for():
    """Generations that say how many tokens they want get buffers that hold them from their
    prompts on (no regrowth on the way: a copy of every buffer), never past the context; the
    tokens are the same as alone."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=200, n_embd=64, n_layer=2, n_head=4)
    model = GPT(config).eval()
    prompts = [[1, 2, 3], [4, 5, 6]]
    want = [generate(model, torch.tensor([p]), 90, temperature=0)[0, 3:].tolist() for p in prompts]
    decoder = BatchedDecoder(model)
    gens = [decoder.add(p, greedy(90)) for p in prompts]
    out: dict = {g: [] for g in gens}
    buffers = None
    while decoder.active:
        for gen, token in decoder.step():  # the first: the prompts, read together
            assert not isinstance(token, Exception), token
            if token is not None:
                out[gen].append(token)
        if decoder.active:
            buffers = buffers if buffers is not None else decoder.pool.k[0]
            assert buffers.shape[2] == 3 + 90 - 1
            assert decoder.pool.k[0] is buffers  # never grown again
    assert [out[g] for g in gens] == want
    decoder.add([7], greedy(10_000))  # past the context: room for the context only
    decoder.step()
    assert decoder.pool.k[0].shape[2] == config.n_positions


def test_a_failing_generation_ends_alone():
    model = _model()
    decoder = BatchedDecoder(model)
    good = decoder.add([1, 2], greedy(4))
    bad = decoder.add([3, 4], greedy(4))
    decoder.step()  # both past their prompts now
    real = model.lm_logits

    def poisoned(hidden):
        out = real(hidden)
        if out.shape[0] == 2:
            out[1] = float("nan")  # the second row (bad) overflows
        return out

    model.lm_logits = poisoned
    events = decoder.step()
    del model.lm_logits
    ends = {g: t for g, t in events if not isinstance(t, int)}
    assert isinstance(ends[bad], Exception) and "NaN" in str(ends[bad])
    assert good in decoder.active and bad not in decoder.active


def test_the_lstm_baseline_decodes_without_a_cache():
    from gpt1.model.lstm import LSTMLM, LSTMConfig

    torch.manual_seed(0)
    lstm = LSTMLM(LSTMConfig(vocab_size=300, n_positions=40, n_embd=32, hidden_size=48)).eval()
    prompt = [1, 2, 3]
    want = generate(lstm, torch.tensor([prompt]), 6, temperature=0)[0, 3:].tolist()
    assert _run(BatchedDecoder(lstm), {0: [(0, (prompt, greedy(6)))]})[0] == want
