"""Generation: greedy equals transformers' generate, the KV cache is exact, filters are right."""

import itertools

import pytest
import torch
from conftest import TINY_MODEL
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt1 import GPT, ModelConfig
from gpt1.errors import ConfigError, Gpt1Error
from gpt1.inference.decoding import KVCache, forward_cached
from gpt1.inference.generate import filter_logits, generate, nucleus
from gpt1.inference.sampling import Sampling
from gpt1.recipes.convert import gpt1_to_hf_state

# The tiny GPT with a vocabulary (89) and a window (40) of sizes no other dimension has.
SAMPLING_MODEL = {**TINY_MODEL, "vocab_size": 89, "n_positions": 40}


def model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    m = GPT(ModelConfig(**SAMPLING_MODEL))
    with torch.no_grad():  # larger weights than the 0.02 init, so greedy paths are not flat
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return m.eval()


def prompt(n: int = 6, batch: int = 2) -> torch.Tensor:
    return torch.randint(
        0, SAMPLING_MODEL["vocab_size"], (batch, n), generator=torch.Generator().manual_seed(7)
    )


def test_greedy_equals_transformers_generate():
    transformers = pytest.importorskip("transformers")
    m = model()
    hf = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**SAMPLING_MODEL)).eval()
    missing, unexpected = hf.load_state_dict(gpt1_to_hf_state(m.state_dict()), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    x = prompt()
    ours = generate(m, x, 20, temperature=0)
    theirs = hf.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False, pad_token_id=0
    )
    assert ours.shape == (2, 26)
    assert torch.equal(ours, theirs)
    assert len(set(ours[0, 6:].tolist())) > 1  # a non-trivial continuation


def test_kv_cache_matches_full_recompute():
    m = model(1)
    x = prompt(5)
    with_cache = generate(m, x, 15, temperature=0, use_cache=True)
    without = generate(m, x, 15, temperature=0, use_cache=False)
    assert torch.equal(with_cache, without)
    # hidden states step by step, including a multi-token chunk after a prefix
    full = torch.cat([x, with_cache[:, 5:]], 1)[:, :20]
    with torch.no_grad():
        ref = m(full)
        cache = KVCache(m.config.n_layer)
        parts = [
            forward_cached(m, full[:, :4], cache),
            forward_cached(m, full[:, 4:9], cache),
            forward_cached(m, full[:, 9:10], cache),
            forward_cached(m, full[:, 10:], cache),
        ]
    assert len(cache) == 20
    assert torch.allclose(torch.cat(parts, 1), ref, atol=1e-5)


def test_generation_past_the_context_slides_the_window():
    m = model(2)
    x = prompt(30, batch=1)
    out = generate(m, x, 25, temperature=0)  # 55 tokens > n_positions = 40
    assert out.shape == (1, 55)
    with torch.no_grad():  # the last token was predicted from the last 40 tokens only
        expected = m.lm_logits(m(out[:, -41:-1]))[:, -1].argmax(-1)
    assert out[0, -1] == expected[0]


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    m = model(3)
    x = prompt(4, batch=1)
    a = generate(m, x, 30, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = generate(m, x, 30, temperature=1.0, generator=torch.Generator().manual_seed(1))
    c = generate(m, x, 30, temperature=1.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_top_k_one_is_greedy():
    m = model(4)
    x = prompt(4)
    sampled = generate(
        m, x, 12, temperature=0.7, top_k=1, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(sampled, generate(m, x, 12, temperature=0))


def test_filters_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))

    def kept(**options) -> list[bool]:
        return filter_logits(logits, Sampling(**options)).isfinite()[0].tolist()

    assert kept(top_k=2) == [True, False, True, False]
    # nucleus 0.75: 0.5 alone is short of it, 0.5 + 0.3 reaches it -> keep exactly those two
    assert kept(top_p=0.75) == [True, False, True, False]
    assert kept(top_p=0.85) == [True, False, True, True]
    assert kept(top_p=0.1) == [True, False, False, False]
    scaled = filter_logits(logits, Sampling(temperature=2.0))
    assert torch.allclose(scaled, logits / 2)


def whole_sort_nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus rule as written: rank every token, keep each whose better-ranked tokens
    have not yet reached top_p (the likeliest always)."""
    probs = logits.softmax(-1)
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    ranked = probs.gather(-1, order)
    keep = (ranked.cumsum(-1) - ranked) < top_p
    keep[..., 0] = True
    return torch.zeros_like(keep).scatter(-1, order, keep)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 3),
    vocab=st.sampled_from([2, 70, 600, 5000]),
    scale=st.floats(0.01, 40.0),
    masked=st.floats(0.0, 0.9),
    top_p=st.floats(1e-6, 0.999999),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_the_nucleus_is_the_whole_sorts(seed, rows, vocab, scale, masked, top_p, dtype):
    """`nucleus` ranks only the likeliest tokens where they reach top_p: it keeps exactly the
    tokens ranking the whole row keeps, for flat and peaked rows, tokens already filtered out
    (-inf), any top_p and each dtype logits come in; only tokens of equal probability may be
    ranked either way."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * scale
    logits[torch.rand(rows, vocab, generator=g) < masked] = float("-inf")
    logits[:, 0] = logits[:, 0].clamp(min=0.0)  # every row keeps a finite logit
    logits = logits.to(dtype)
    probs = logits.softmax(-1)
    for row in probs:  # ties among the tokens that carry mass: either ranking is right
        positive = row[row > 0]
        if positive.unique().numel() != positive.numel():
            return
    assert torch.equal(nucleus(logits, top_p), whole_sort_nucleus(logits, top_p))


def test_a_peaked_row_ranks_only_its_likeliest_tokens(monkeypatch):
    """A peaked row's nucleus is found without ranking the whole row; a flat row's needs the
    whole ranking, and both keep what the whole sort keeps."""
    from gpt1.inference import generate as generating

    ranked = []
    real = generating._ranking
    monkeypatch.setattr(generating, "_ranking", lambda logits: ranked.append(1) or real(logits))
    g = torch.Generator().manual_seed(0)
    peaked = torch.randn(2, 40478, generator=g) * 6
    got = nucleus(peaked, 0.9)
    assert not ranked and 1 <= int(got.sum()) < 4000
    flat = torch.randn(2, 40478, generator=g) * 0.1
    got_flat = nucleus(flat, 0.9)
    assert ranked and int(got_flat.sum()) > 30000
    assert torch.equal(got, whole_sort_nucleus(peaked, 0.9))
    assert torch.equal(got_flat, whole_sort_nucleus(flat, 0.9))


def test_sampling_follows_the_filtered_distribution():
    m = model(5)
    x = prompt(3, batch=1).repeat(4000, 1)
    out = generate(m, x, 1, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        probs = filter_logits(m.lm_logits(m(x[:1]))[:, -1], Sampling(top_k=3)).softmax(-1)[0]
    counts = torch.bincount(out[:, -1], minlength=SAMPLING_MODEL["vocab_size"]).float() / len(out)
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(
        torch.topk(probs, 3).indices.tolist()
    )
    assert torch.allclose(counts, probs, atol=0.03)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1.0),
        dict(top_k=0),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(max_new_tokens=-1),
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(top_p=float("nan")),
    ],
)
def test_bad_options(kwargs):
    args = dict(max_new_tokens=3, temperature=1.0)
    args.update(kwargs)
    with pytest.raises(ConfigError):
        generate(model(), prompt(), **args)


def test_bad_prompts():
    with pytest.raises(ConfigError, match="empty prompt"):
        generate(model(), torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ConfigError, match=r"prompt ids must be in \[0, 89\)"):
        generate(model(), torch.tensor([[5, 89]]), 3)


@pytest.mark.parametrize(
    "options",
    [
        dict(temperature=1e-40),  # logits / temperature overflows float32
        dict(temperature=1e-30, top_k=5),
        dict(temperature=5e-324),  # the smallest float above 0
        dict(temperature=1.0, top_p=1e-50),  # 0 in float32: every token's mass "reaches" it
        dict(temperature=0.7, top_p=5e-324),
        dict(temperature=1e-40, top_k=3, top_p=1e-46),
    ],
)
def test_extreme_valid_options_sample_the_limit_distribution_greedy(options):
    """A temperature or top-p so small that float32 cannot hold the arithmetic still samples:
    the one likeliest token, as greedy decoding does, never a crash."""
    m = model(6)
    x = prompt(5)
    sampled = generate(m, x, 8, generator=torch.Generator().manual_seed(0), **options)
    assert torch.equal(sampled, generate(m, x, 8, temperature=0))


def test_an_overflowing_temperature_keeps_the_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, -float("inf")]])
    kept = filter_logits(logits, Sampling(temperature=1e-40, top_k=2))
    assert kept.softmax(-1)[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    tiny_nucleus = filter_logits(logits, Sampling(temperature=1.0, top_p=1e-50))
    assert tiny_nucleus.isfinite()[0].tolist() == [True, False, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fast_sampling_path_matches_isfinite_and_argmax(dtype):
    """`all_finite` is `isfinite(...).all()` (NaN, +inf or -inf anywhere, or none), and the
    greedy choice is argmax's, ties included (the first largest)."""
    from gpt1.inference.generate import all_finite, next_tokens

    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(4, 40481, generator=gen).mul(3).round().to(dtype)  # many ties
    greedy = Sampling(temperature=0)
    assert torch.equal(next_tokens(rows, greedy, None), rows.argmax(-1, keepdim=True))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for where in (0, 20000, 40480):
            damaged = rows.clone()
            damaged[2, where] = bad
            assert all_finite(damaged) is False
    assert all_finite(rows) is True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_greedy_choice_is_argmax_and_finds_every_non_finite_logit(dtype):
    """gpt1's kernel (which `next_tokens` uses at temperature 0 where it is built) picks
    argmax's token, ties included, on rows of any length (a last, short vector; all negative),
    and reports a NaN or an infinity wherever it is; `next_tokens` then refuses the row."""
    from gpt1.inference import backend
    from gpt1.inference.generate import next_tokens

    greedy = backend.greedy_op()
    if greedy is None:
        pytest.skip("the decoding kernel is not built (gpt1 kernels build) or cannot be here")
    gen = torch.Generator().manual_seed(1)
    for V in (1, 15, 17, 40478):
        rows = torch.randn(3, V, generator=gen).mul(3).round().sub(20).to(dtype)  # ties, < 0
        ids, finite = greedy(rows)
        assert finite is True and ids.dtype == torch.int64
        assert torch.equal(ids, rows.argmax(-1, keepdim=True))
        for bad in (float("nan"), float("inf"), float("-inf")):
            for row, where in itertools.product((0, 2), {0, V // 2, V - 1}):
                damaged = rows.clone()  # either end of the rows the threads split
                damaged[row, where] = bad
                assert greedy(damaged)[1] is False
                with pytest.raises(Gpt1Error, match="NaN or infinite logits"):
                    next_tokens(damaged, Sampling(temperature=0), None)


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    row=st.lists(st.sampled_from([-3.0, -1.0, -0.0, 0.0, 0.5, 2.0, 7.0]), min_size=1, max_size=90),
    top=st.lists(st.integers(0, 89), max_size=3),
)
def test_the_kernels_greedy_choice_is_the_first_largest_wherever_it_lies(dtype, row, top):
    """Wherever the largest logits lie (first, last, within a vector or in the short tail,
    equal ones anywhere, 0.0 beside -0.0), the kernel's choice is argmax's: the first."""
    from gpt1.inference import backend

    greedy = backend.greedy_op()
    if greedy is None:
        pytest.skip("the decoding kernel is not built (gpt1 kernels build) or cannot be here")
    for at in top:
        row[at % len(row)] = 9.0
    rows = torch.tensor([row, row[::-1]], dtype=dtype)
    ids, finite = greedy(rows)
    assert finite is True and torch.equal(ids, rows.argmax(-1, keepdim=True))


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 0.0, 1e-30, 0.5, 1.0, 3.0]), min_size=1, max_size=40),
    seed=st.integers(0, 2**31),
)
def test_draw_never_takes_an_id_of_probability_zero(weights, seed):
    """Wherever the zeros lie (first, last, between), `draw` takes only ids of positive
    probability, the rows' sums need not be 1, and a row whose sum is 0 is refused."""
    from gpt1.inference.generate import draw

    probs = torch.tensor([weights] * 500, dtype=torch.float32)
    if not any(weights):
        with pytest.raises(ValueError, match="sums to 0"):
            draw(probs, torch.Generator().manual_seed(seed))
        return
    ids = draw(probs, torch.Generator().manual_seed(seed))
    assert ids.shape == (500, 1) and bool((probs.gather(1, ids) > 0).all())


def test_draw_follows_the_distribution_and_its_generator(monkeypatch):
    """Many draws of one row match its probabilities (chi-square, p > 0.001); the same
    generator state gives the same ids; a uniform number that rounds up to the row's whole sum
    still takes the last id of positive probability."""
    from scipy.stats import chisquare

    from gpt1.inference.generate import draw

    p = torch.tensor([0.1, 0.0, 0.25, 0.05, 0.4, 0.2, 0.0])
    ids = draw(p.expand(20_000, -1), torch.Generator().manual_seed(0))[:, 0]
    counts = torch.bincount(ids, minlength=7)
    assert counts[1] == 0 and counts[6] == 0
    kept = p > 0
    assert chisquare(counts[kept].numpy(), (p[kept] * 20_000).numpy()).pvalue > 0.001
    again = draw(p.expand(20_000, -1), torch.Generator().manual_seed(0))[:, 0]
    assert torch.equal(ids, again)
    highest = 1.0 - 2.0**-53  # the largest number below 1: times 3.0 it rounds to 3.0
    monkeypatch.setattr(
        torch, "rand", lambda *a, **k: torch.full((1, 1), highest, dtype=k["dtype"])
    )
    assert draw(torch.tensor([[1.0, 2.0, 0.0]]), None).tolist() == [[1]]


def test_one_sampling_value_draws_what_the_spelled_out_options_draw():
    """`sample_ids`, `generate_stream` and `BatchedDecoder.add` take the options as one
    `Sampling`; with a seed and no generator they draw from a generator seeded with it, so the
    three give `generate`'s tokens with that generator."""
    from gpt1.inference.batched import BatchedDecoder
    from gpt1.inference.generate import generate_stream, sample_ids

    m, x = model(6), prompt(5, batch=1)
    options = dict(temperature=0.9, top_k=20, top_p=0.9)
    want = generate(m, x, 10, generator=torch.Generator().manual_seed(3), **options)
    sampling = Sampling(max_new_tokens=10, seed=3, **options)
    assert torch.equal(sample_ids(m, x, sampling), want)
    assert torch.equal(torch.cat(list(generate_stream(m, x, sampling)), 1), want[:, 5:])
    decoder = BatchedDecoder(m)
    decoder.add(x[0].tolist(), sampling)
    got = []
    while decoder.active:
        got += [token for _, token in decoder.step() if token is not None]
    assert got == want[0, 5:].tolist()
    with pytest.raises(ConfigError, match="empty prompt"):  # the prompt is checked at once
        generate_stream(m, torch.zeros(1, 0, dtype=torch.long), sampling)


def test_sampling_keeps_to_the_window_the_model_was_pretrained_on(tmp_path, caplog):
    """A checkpoint whose run trained 16-token windows (run.json) of a 64-position model: a
    longer prompt keeps its last 16 tokens, and generation past position 16 is warned about
    (`gpt1 serve` refuses it), naming how many new tokens would stay inside."""
    import json
    import logging

    from gpt1.recipes.sample import Sampler
    from helpers.tiny import tiny_checkpoint

    folder = tiny_checkpoint(tmp_path / "run" / "final")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"data": {"n_ctx": 16}}))
    sampler = Sampler(folder, "cpu", "fp32")
    assert sampler.window == 16 < sampler.model.config.n_positions
    with caplog.at_level(logging.WARNING):
        ids = sampler.prompt_ids(prompt_ids=list(range(1, 21)))
        assert ids == list(range(5, 21))
        assert "keeping the last 16 (the window the model was trained on)" in caplog.text
        caplog.clear()
        sampler.draw(ids[:10], Sampling(max_new_tokens=4, temperature=0))
        assert "past the" not in caplog.text
        sampler.draw(ids[:10], Sampling(max_new_tokens=8, temperature=0))
        assert "reach position 18, past the 16-token window" in caplog.text
        assert "at most 6 new tokens" in caplog.text


def test_gpt1_sample_says_what_it_loads_its_speed_and_when_it_passes_the_window(tmp_path):
    """Without -q: a line before loading, the speed after the answer; a generation past the
    trained window is warned about up front and once more when it passes it (the step that
    starts re-reading), even with -q; -q keeps only the warnings."""
    import contextlib
    import io
    import json

    from gpt1.cli import main
    from helpers.tiny import run_cli, tiny_checkpoint

    folder = tiny_checkpoint(tmp_path / "run" / "final")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"data": {"n_ctx": 16}}))
    argv = ["sample", str(folder), "--prompt-ids", "5 6 7", "--temperature", "0"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--max-new-tokens", "20", "--precision", "int8"]) == 0
    lines = err.getvalue().splitlines()
    assert f"loading {folder} (int8: quantising) ..." in lines
    assert lines[-1].startswith("3 prompt tokens, 20 new tokens in ") and "tokens/s)" in lines[-1]
    passed = [line for line in lines if "generation passed the 16-token window" in line]
    assert len(passed) == 1 and passed[0].startswith("position 17:")
    assert any("past the 16-token window" in line for line in lines[: lines.index(passed[0])])

    code, quiet = run_cli([*argv, "--max-new-tokens", "20", "--num-samples", "2"])
    assert code == 0 and "loading" not in quiet and "tokens/s" not in quiet
    assert quiet.count("generation passed the 16-token window") == 1
    code, quiet = run_cli([*argv, "--max-new-tokens", "14"])  # 3 + 14 = 17: no step re-reads
    assert code == 0 and "passed" not in quiet and "past the 16-token window" in quiet
    code, quiet = run_cli([*argv, "--max-new-tokens", "13"])
    assert code == 0 and quiet == ""


def test_sampling_past_the_window_reads_the_last_window_tokens(tmp_path):
    """Past the trained window, generation re-reads the last `window` tokens: the same tokens
    as a model whose n_positions is that window."""
    import json

    from gpt1.inference.generate import generate_stream
    from gpt1.recipes.sample import Sampler
    from helpers.tiny import tiny_checkpoint

    folder = tiny_checkpoint(tmp_path / "run" / "final")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"data": {"n_ctx": 16}}))
    sampler = Sampler(folder, "cpu", "fp32")
    sampling = Sampling(max_new_tokens=24, temperature=0)
    got = sampler.draw([5, 6, 7], sampling)[0].ids[3:]
    prompt = torch.tensor([[5, 6, 7]])
    reread = generate_stream(sampler.model, prompt, sampling, use_cache=False, window=16)
    assert got == [int(t) for t in reread]
    assert sampler.speed is not None and sampler.speed.new_tokens == 24


@pytest.mark.parametrize("temperature", [0.0, 1.0, 50.0])
def test_choose_draws_only_ids_the_tokenizer_has(temperature):
    """A model with more rows than its tokenizer has ids draws among the tokenizer's: greedy
    takes the best of those, sampling never reaches past them."""
    from gpt1.inference.generate import choose

    logits = torch.zeros(3, 300)
    logits[:, 250] = 20.0  # the model's favourite lies past the tokenizer's 192 ids
    logits[:, 7] = 5.0
    sampling = Sampling(max_new_tokens=1, temperature=temperature, seed=0)
    ids = choose(logits, sampling, sampling.generator(torch.device("cpu")), vocab=192)
    assert ids.shape == (3, 1) and int(ids.max()) < 192
    if temperature == 0:
        assert ids.flatten().tolist() == [7, 7, 7]
    greedy = Sampling(max_new_tokens=1, temperature=0.0)
    assert int(choose(logits, greedy, None)[0, 0]) == 250  # no vocab: every row


def test_sample_decodes_a_model_with_more_rows_than_its_tokenizer(tmp_path):
    """tiny_checkpoint's model has 300 rows, its character tokenizer 189 ids + 3 task tokens:
    gpt1 sample refused mid-way ("token id 271 is outside this vocabulary")."""
    from gpt1.recipes.sample import Sampler
    from helpers.tiny import tiny_checkpoint

    sampler = Sampler(tiny_checkpoint(tmp_path / "ck"), "cpu", "fp32")
    assert sampler.model.config.vocab_size == 300 and sampler.vocab == len(sampler.tokenizer) < 300
    for seed in range(4):
        # a flat distribution: ids past 192 were likely
        sampling = Sampling(max_new_tokens=40, temperature=5.0, seed=seed)
        (sample,) = sampler.draw([1, 2, 3], sampling)
        assert max(sample.ids[3:]) < sampler.vocab and sample.text is not None
        assert "".join(sampler.stream([1, 2, 3], sampling)) == sample.text
