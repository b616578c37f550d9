"""Zero-shot: the selective batched scorer (gpt1/inference/scoring.py), the heuristics, the
datasets and the curve (gpt1/zeroshot/heuristics.py, data.py, curve.py)."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from conftest import TINIER_MODEL, tiny_model_config

from gpt1.errors import DataError
from gpt1.inference.scoring import Score, Scorer
from gpt1.model.checkpoint import save_model
from gpt1.model.gpt import GPT
from gpt1.tasks.examples import ChoiceExample
from gpt1.zeroshot import curve as zc
from gpt1.zeroshot import data as zd
from gpt1.zeroshot import heuristics as zh
from helpers.tiny import CHAR_PIECES, char_vocab


def tiny_model(vocab: int = 50, seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_model_config(**{"vocab_size": vocab, "n_positions": 24, **kw})).eval()
    with torch.no_grad():  # larger weights than the init, so log-probs differ visibly by position
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def reference_logprobs(model: torch.nn.Module, ctx: list[int], cont: list[int]) -> list[float]:
    """The plain way: full logits at every position of one unpadded sequence."""
    n = model.config.n_positions
    full = (ctx + cont)[-(n + 1) :][:-1] if len(ctx) + len(cont) - 1 > n else (ctx + cont)[:-1]
    with torch.no_grad():
        logp = torch.log_softmax(model.lm_logits(model(torch.tensor([full]))), -1)[0]
    first = len(full) - len(cont)
    return [float(logp[first + i, t]) for i, t in enumerate(cont)]


def random_requests(rng: random.Random, n: int, vocab: int) -> list[tuple[list[int], list[int]]]:
    reqs = []
    for _ in range(n):
        ctx = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        reqs.append((ctx, [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]))
    # Shared contexts, exact duplicates, a prefix of another request, and one too long to fit.
    reqs.append((reqs[0][0], [7]))
    reqs.append((reqs[0][0], [9]))
    reqs.append(reqs[1])
    reqs.append((reqs[2][0][:2], reqs[2][0][2:4] or [3]))
    reqs.append(([rng.randrange(vocab) for _ in range(40)], [1, 2, 3]))
    return reqs


def test_scorer_equals_full_logits_computation():
    model = tiny_model()
    reqs = random_requests(random.Random(0), 30, 50)
    scorer = Scorer(model, batch_tokens=64, max_rows=5, logits_chunk=7)
    scored = scorer.score(reqs)
    assert scorer.truncated == 1
    for (ctx, cont), s in zip(reqs, scored):
        ref = reference_logprobs(model, ctx, cont)
        assert s.logprobs == pytest.approx(ref, abs=1e-5)
    # greedy flag: a continuation made of the argmax tokens is greedy, a changed one is not
    ctx = reqs[0][0]
    with torch.no_grad():
        best = int(model.lm_logits(model(torch.tensor([ctx])))[0, -1].argmax())
    a, b = scorer.score([(ctx, [best]), (ctx, [(best + 1) % 50])], greedy=True)
    assert a.greedy is True and b.greedy is False
    assert scorer.score([(ctx, [best])])[0].greedy is None


def test_scorer_top_alternatives_are_the_full_distributions_top_k():
    """`top=k`: each scored position's k likeliest tokens, as a full log-softmax ranks them,
    with the very numbers of `logprobs` (so "the token is the top one" is an exact equality)."""
    model = tiny_model()
    reqs = random_requests(random.Random(1), 12, 50)[:-1]  # all fit the window
    scorer = Scorer(model, batch_tokens=64, max_rows=5, logits_chunk=7)
    for (ctx, cont), s in zip(reqs, scorer.score(reqs, top=3)):
        row = ctx + cont[:-1]
        with torch.no_grad():
            logp = torch.log_softmax(model.lm_logits(model(torch.tensor([row]))), -1)[0]
        for i, alts in enumerate(s.top):
            values, ids = logp[len(ctx) - 1 + i].topk(3)
            assert [t for t, _ in alts] == ids.tolist()
            assert [lp for _, lp in alts] == pytest.approx(values.tolist(), abs=1e-5)
    ctx = reqs[0][0]
    with torch.no_grad():
        best = int(model.lm_logits(model(torch.tensor([ctx])))[0, -1].argmax())
    (s,) = scorer.score([(ctx, [best])], top=1)
    assert s.top[0][0][0] == best and s.logprobs[0] == s.top[0][0][1]  # exactly
    assert scorer.score(reqs[:2])[0].top is None


def test_scorer_works_with_the_lstm_baseline():
    from gpt1.model.lstm import LSTMLM, LSTMConfig

    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=50, n_embd=16, hidden_size=32, n_positions=24)).eval()
    reqs = random_requests(random.Random(3), 10, 50)
    for (ctx, cont), s in zip(reqs, Scorer(model, batch_tokens=64).score(reqs)):
        assert s.logprobs == pytest.approx(reference_logprobs(model, ctx, cont), abs=1e-5)


def test_scorer_shares_prefix_rows():
    model = tiny_model()
    scorer = Scorer(model)
    plans, canon = scorer._plan(
        [([1, 2, 3], [4, 5]), ([1, 2], [3]), ([1, 2, 3], [9]), ([7, 8], [1])]
    )
    assert len(set(canon.values())) == 2  # [1,2,3,4] covers the other two rows; [7,8] alone


def test_scorer_truncates_a_continuation_longer_than_the_window():
    model = tiny_model()  # n_positions 24
    scorer = Scorer(model)
    cont = list(range(1, 31))
    (s,) = scorer.score([([5, 6], cont)])
    assert scorer.truncated == 1 and len(s.logprobs) == 24  # one context token + 23 = 24 rows
    assert s.logprobs == pytest.approx(reference_logprobs(model, [6], cont[:24]), abs=1e-5)


def test_scorer_rejects_empty_context():
    with pytest.raises(ValueError):
        Scorer(tiny_model()).score([([], [1])])


def test_scorer_bf16_close_to_fp32():
    model = tiny_model()
    reqs = random_requests(random.Random(1), 10, 50)
    fp32 = Scorer(model).score(reqs)
    bf16 = Scorer(tiny_model().to(torch.bfloat16)).score(reqs)
    for a, b in zip(fp32, bf16):
        assert b.logprobs == pytest.approx(a.logprobs, abs=0.25)


def test_scorer_bf16_reuses_its_logits_buffers_without_mixing_chunks():
    # logits_chunk=3 forces several chunks per batch through the same 16-bit and fp32 buffers;
    # each request must still get its own positions' values (the plain bf16 computation).
    model = tiny_model().to(torch.bfloat16)
    reqs = [r for r in random_requests(random.Random(2), 12, 50) if len(r[0]) + len(r[1]) <= 25]
    scorer = Scorer(model, logits_chunk=3)
    scored = scorer.score(reqs)
    assert set(scorer._logits_buffers) == {torch.bfloat16, torch.float32}
    for (ctx, cont), s in zip(reqs, scored):
        full = (ctx + cont)[:-1]
        with torch.no_grad():
            logits = model.lm_logits(model(torch.tensor([full])))[0].float()
        logp = torch.log_softmax(logits, -1)
        first = len(full) - len(cont)
        ref = [float(logp[first + i, t]) for i, t in enumerate(cont)]
        assert s.logprobs == pytest.approx(ref, abs=0.05)


def hf_model_from(model: GPT):
    transformers = pytest.importorskip("transformers")
    c = model.config
    cfg = transformers.OpenAIGPTConfig(
        vocab_size=c.vocab_size,
        n_positions=c.n_positions,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        afn="gelu",
        resid_pdrop=0,
        embd_pdrop=0,
        attn_pdrop=0,
    )
    hf = transformers.OpenAIGPTLMHeadModel(cfg).eval()
    state = {}
    for k, v in model.state_dict().items():
        if k == "wte.weight":
            state["transformer.tokens_embed.weight"] = v
        elif k == "wpe.weight":
            state["transformer.positions_embed.weight"] = v
        elif k.endswith("weight") and (".c_" in k):
            state["transformer." + k] = v.t()  # nn.Linear [out, in] -> HF Conv1D [in, out]
        else:
            state["transformer." + k] = v
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    return hf


def test_scorer_matches_hf_full_logits():
    model = tiny_model()
    hf = hf_model_from(model)
    reqs = [r for r in random_requests(random.Random(2), 12, 50) if len(r[0]) + len(r[1]) <= 25]
    scored = Scorer(model, batch_tokens=100).score(reqs)
    for (ctx, cont), s in zip(reqs, scored):
        with torch.no_grad():
            logits = hf(torch.tensor([ctx + cont[:-1]])).logits[0]  # [T, V] at every position
        logp = torch.log_softmax(logits, -1)
        ref = [float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)]
        assert s.logprobs == pytest.approx(ref, abs=1e-4)


# --------------------------------------------------------------------------- heuristics
class WordTok:
    """Whitespace word-level tokenizer over a fixed word list (id = index, unknown = 0)."""

    def __init__(self, words: list[str]):
        self.ids = {w: i for i, w in enumerate(["<unk>"] + words)}

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(w, 0) for w in text.lower().split()]


WORDS = "very positive negative good bad movie the n/a film a b c bee flower it had pollen because".split()


def rig(model: GPT, token: int) -> GPT:
    """Make the last hidden state constant and pointing at `token`'s embedding: it always wins."""
    with torch.no_grad():
        ln = model.h[-1].ln_2
        ln.weight.zero_()
        model.wte.weight[token] *= 3
        ln.bias.copy_(model.wte.weight[token])
    return model


def test_sst2_rigged_model_predicts_one_class():
    tok = WordTok(WORDS)
    examples = [("good movie", 1), ("bad film", 0), ("the movie", 1), ("bad", 0), ("a film", 0)]
    for word, expect_positive in (("positive", True), ("negative", False)):
        model = rig(tiny_model(vocab=len(WORDS) + 1), tok.ids[word])
        r = zh.zs_sst2(Scorer(model), tok, examples)
        assert r["predicted_positive"] == (1.0 if expect_positive else 0.0)
        assert r["accuracy"] == pytest.approx(0.4 if expect_positive else 0.6)


class FakeScorer:
    """Returns a fixed log-prob for each (context text, continuation text) pair."""

    def __init__(self, tok: WordTok, table: dict[tuple[str, str], float]):
        names = {i: w for w, i in tok.ids.items()}
        self.table, self.names = table, names
        self.truncated = 0

    def score(self, reqs, greedy=False):
        out = []
        for ctx, cont in reqs:
            key = (" ".join(self.names[i] for i in ctx), " ".join(self.names[i] for i in cont))
            out.append(Score([self.table[key]] * len(cont), False))
        return out


def log_probs(context: str, by_continuation: dict[str, float]) -> dict[tuple[str, str], float]:
    """A `FakeScorer` table's entries for one context: (context, continuation) -> log-prob."""
    return {(context, continuation): lp for continuation, lp in by_continuation.items()}


def test_sst2_calibration_removes_the_prior():
    tok = WordTok(WORDS)
    # A strong prior for "positive" after the content-free prompt "N/A very".
    table = {
        **log_probs("n/a very", {"positive": -0.5, "negative": -3.0}),
        **log_probs("good very", {"positive": -0.4, "negative": -3.5}),
        **log_probs("bad very", {"positive": -1.0, "negative": -2.0}),
    }
    examples = [("good", 1), ("bad", 0)]
    plain = zh.zs_sst2(FakeScorer(tok, table), tok, examples)
    calibrated = zh.zs_sst2(FakeScorer(tok, table), tok, examples, calibrate=True)
    assert plain["predicted_positive"] == 1.0 and plain["accuracy"] == 0.5
    assert calibrated["accuracy"] == 1.0


def test_sst2_multi_piece_word_scored_by_sum():
    class PieceTok(WordTok):
        def encode(self, text):  # "negative" is two pieces, "positive" one
            return [
                i
                for w in text.lower().split()
                for i in (
                    [self.ids["a"], self.ids["b"]] if w == "negative" else [self.ids.get(w, 0)]
                )
            ]

    tok = PieceTok(WORDS)
    # pieces of "negative" have -1 each (sum -2) vs "positive" -1.5: sum says positive,
    # a per-token mean would say negative.
    table = {("good very", "positive"): -1.5, ("good very", "a b"): -1.0}
    r = zh.zs_sst2(FakeScorer(tok, table), tok, [("good", 1)])
    assert r["accuracy"] == 1.0 and r["pieces"] == {"negative": 2, "positive": 1}


def brute_force_best_mcc(scores, labels):
    from sklearn.metrics import matthews_corrcoef

    cuts = [math.inf] + sorted(set(scores.tolist()), reverse=True)
    return max(matthews_corrcoef(labels, (scores >= t).astype(int)) for t in cuts)


def test_best_threshold_hand_case_and_against_brute_force():
    t, mcc = zh.best_threshold(np.array([3.0, 2.0, 1.0, 0.0]), np.array([1, 1, 0, 0]))
    assert t == 1.5 and mcc == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = rng.integers(0, 6, size=30).astype(float)  # many ties
        labels = (rng.random(30) < 0.6).astype(int)
        t, mcc = zh.best_threshold(scores, labels)
        assert mcc == pytest.approx(brute_force_best_mcc(scores, labels))
        from sklearn.metrics import matthews_corrcoef

        assert matthews_corrcoef(labels, (scores >= t).astype(int)) == pytest.approx(mcc)


def test_cola_threshold_comes_from_train_split():
    tok = WordTok(WORDS)
    mean = {"a": -1.0, "b": -2.0, "c": -3.0, "movie": -4.0}  # sentence = "the X"
    table = {("the", w): v for w, v in mean.items()}
    train = [("the a", 1), ("the b", 1), ("the c", 0), ("the movie", 0)]  # best cut: -2.5
    dev = [("the a", 1), ("the b", 0), ("the c", 1), ("the movie", 0)]
    r = zh.zs_cola(FakeScorer(tok, table), tok, train, dev)
    assert r["threshold"] == pytest.approx(-2.5) and r["train_mcc"] == pytest.approx(1.0)
    # dev predictions use the train threshold: a,b -> 1; c,movie -> 0 => MCC 0
    assert r["mcc"] == pytest.approx(0.0) and r["accuracy"] == 0.5


def test_dpr_requests_and_decision():
    tok = WordTok(WORDS)
    ex = zd.DprExample("The bee had the flower because it had pollen", "it", ("bee", "flower"), 1)
    (c0, r0), (c1, r1) = zh.dpr_requests(tok, ex)
    assert c0 == tok.encode("the bee had the flower because bee")
    assert c1 == tok.encode("the bee had the flower because flower")
    assert r0 == r1 == tok.encode("had pollen")
    table = {
        ("the bee had the flower because bee", "had pollen"): -3.0,
        ("the bee had the flower because flower", "had pollen"): -1.0,
    }
    assert zh.zs_dpr(FakeScorer(tok, table), tok, [ex])["accuracy"] == 1.0
    table[("the bee had the flower because bee", "had pollen")] = -0.5
    assert zh.zs_dpr(FakeScorer(tok, table), tok, [ex])["accuracy"] == 0.0


def test_lambada_greedy_accuracy_with_rigged_model():
    tok = WordTok(WORDS)
    model = rig(tiny_model(vocab=len(WORDS) + 1), tok.ids["pollen"])
    r = zh.zs_lambada(Scorer(model), tok, [("the bee had", "pollen"), ("the bee had", "it")])
    assert r["accuracy"] == 0.5 and r["unknown_targets"] == 0
    # A model that always predicts <unk> does not get credit for unknown words.
    tok.unk_id = 0
    model = rig(tiny_model(vocab=len(WORDS) + 1), 0)
    r = zh.zs_lambada(Scorer(model), tok, [("the bee had", "zebra"), ("the bee had", "it")])
    assert r["accuracy"] == 0.0 and r["unknown_targets"] == 1


def test_story_cloze_and_race_pick_likelier_mean():
    tok = WordTok(WORDS)
    table = {
        **log_probs("the bee", {"had pollen": -1.0, "it": -2.0}),
        **log_probs("the bee a", {"good": -3.0, "bad": -0.5, "it": -1.0, "film": -4.0}),
    }
    sc = ChoiceExample("the bee", "", ["it", "had pollen"], 1)
    assert zh.zs_story_cloze(FakeScorer(tok, table), tok, [sc])["accuracy"] == 1.0
    race = ChoiceExample("the bee", "a", ["good", "bad", "it", "film"], 1)
    assert zh.zs_race(FakeScorer(tok, table), tok, [race])["accuracy"] == 1.0


@pytest.mark.parametrize("task", list(zh.REFERENCES))
def test_normalised_score_is_zero_at_chance_one_at_reference(task):
    ref = zh.REFERENCES[task]
    assert zh.normalised(task, ref.chance) == pytest.approx(0.0)
    assert zh.normalised(task, ref.sota) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------- readers
def test_dpr_reader(tmp_path):
    f = tmp_path / "test.c.txt"
    f.write_text(
        "The bee landed on the flower because it had pollen.\nit\nbee,flower\nflower\n\n"
        "John asked Bill because he knew.\nhe\nJohn, Bill\nBill\n\n\n"
    )
    exs = zd.read_dpr(f)
    assert exs[0] == zd.DprExample(
        "The bee landed on the flower because it had pollen.", "it", ("bee", "flower"), 1
    )
    assert exs[1].candidates == ("John", "Bill") and exs[1].answer == 1
    f.write_text("A sentence with it.\nit\nx,y\nx\n\nbroken block\nit\nx,y\n")
    with pytest.raises(DataError, match=r"test.c.txt:6.*4 lines"):
        zd.read_dpr(f)
    f.write_text("A sentence with it.\nit\nx,y\nz\n")
    with pytest.raises(DataError, match=r"test.c.txt:4, field 'answer'"):
        zd.read_dpr(f)
    f.write_text("A sentence without.\nit\nx,y\nx\n")
    with pytest.raises(DataError, match=r":2, field 'pronoun'"):
        zd.read_dpr(f)


def test_lambada_reader(tmp_path):
    lam = tmp_path / "lambada.txt"
    lam.write_text("he said hello to the dog\n\nshe went home\n")
    assert zd.read_lambada(lam) == [("he said hello to the", "dog"), ("she went", "home")]
    lam.write_text("fine line here\nalone\n")
    with pytest.raises(DataError, match=r"lambada.txt:2"):
        zd.read_lambada(lam)


def test_race_folder_through_task_readers(tmp_path):
    race = tmp_path / "RACE" / "dev" / "high"
    race.mkdir(parents=True)
    (race / "1.txt").write_text(
        json.dumps(
            {
                "article": "A text.",
                "questions": ["Q1?", "Q2?"],
                "options": [["a", "b", "c", "d"], ["e", "f", "g", "h"]],
                "answers": ["B", "D"],
                "id": "1.txt",
            }
        )
    )
    folder = zh.task_folder("race", tmp_path)
    loaded = zh.TASKS["race"].load(folder, None)  # no test split here: dev is used
    assert [e.label for e in loaded["examples"]] == [1, 3] and "dev" in loaded["file"]


def test_loaders_on_shared_data(shared_data):
    sst = zh.TASKS["sst2"].load(zh.task_folder("sst2", shared_data), None)["examples"]
    assert len(sst) == 872 and {y for _, y in sst} == {0, 1}
    cola = zh.TASKS["cola"].load(zh.task_folder("cola", shared_data), None)
    assert len(cola["train"]) == 8551 and len(cola["dev"]) == 1043
    assert len(zd.read_lambada(shared_data / "corpus/lambada")) == 5153
    sc = zh.TASKS["story_cloze"].load(zh.task_folder("story_cloze", shared_data), None)
    assert len(sc["examples"]) == 1871 and "test" in sc["file"]


# --------------------------------------------------------------------------------------- CLI
def make_run(tmp_path, steps=(10, 100)):
    vocab_dir, n = char_vocab(tmp_path / "vocab"), len(CHAR_PIECES)
    run = tmp_path / "run"
    for step in steps:
        save_model(tiny_model(vocab=n, seed=step, n_positions=128), run / f"step-{step}", vocab_dir)
    return run


def write_small_data(root):
    (root / "glue/SST-2").mkdir(parents=True)
    (root / "glue/SST-2/dev.tsv").write_text("sentence\tlabel\ngood film\t1\nbad film\t0\nok\t1\n")
    (root / "dpr").mkdir()
    (root / "dpr/test.c.txt").write_text(
        "the bee had the flower as it had pollen\nit\nbee,flower\nflower\n"
    )


def test_cli_out_writes_one_line_per_example(tmp_path):
    """OUT/TASK.jsonl: per example its id, the chosen answer, each choice's score (the scorer's
    own numbers) and the gold answer; the lines add up to results.json's accuracy."""
    from gpt1.cli import main
    from gpt1.inference.loading import load_for_inference

    run = make_run(tmp_path)
    write_small_data(tmp_path / "data")
    out = tmp_path / "zs"
    argv = [
        "zeroshot",
        str(run / "step-10"),
        "--task",
        "sst2,dpr",
        "--data",
        str(tmp_path / "data"),
    ]
    assert main([*argv, "--out", str(out), "--device", "cpu"]) == 0
    results = json.loads((out / "results.json").read_text())["tasks"]
    assert "examples" not in results["sst2"]
    sst2 = [json.loads(line) for line in (out / "sst2.jsonl").read_text().splitlines()]
    dpr = [json.loads(line) for line in (out / "dpr.jsonl").read_text().splitlines()]
    assert [r["id"] for r in sst2] == [0, 1, 2] and [r["gold"] for r in sst2][:2] == [
        "positive",
        "negative",
    ]
    assert dpr[0]["choices"] == ["bee", "flower"] and dpr[0]["gold"] == "flower"
    for rows, task in ((sst2, "sst2"), (dpr, "dpr")):
        for r in rows:
            assert r["answer"] == r["choices"][max(range(2), key=r["scores"].__getitem__)]
        right = sum(r["answer"] == r["gold"] for r in rows) / len(rows)
        assert right == pytest.approx(results[task]["value"])
    loaded = load_for_inference(run / "step-10", "cpu", "fp32")
    tok, scorer = loaded.tokenizer, Scorer(loaded.lm, max_context=loaded.window)
    words = [tok.encode("negative"), tok.encode("positive")]
    own = scorer.score([(tok.encode("good film very"), w) for w in words])
    assert sst2[0]["scores"] == pytest.approx([s.total for s in own], abs=1e-5)


def test_cli_single_checkpoint_and_run_curve(tmp_path, monkeypatch):
    from gpt1.cli import main

    run = make_run(tmp_path)
    data = tmp_path / "data"
    write_small_data(data)
    out = tmp_path / "zs1"
    assert (
        main(
            [
                "zeroshot",
                str(run / "step-10"),
                "--task",
                "sst2",
                "--data",
                str(data / "glue/SST-2"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads((out / "results.json").read_text())["tasks"]["sst2"]
    assert res["n"] == 3 and res["normalised"] == pytest.approx(zh.normalised("sst2", res["value"]))
    # The curve over the run; tasks without data (cola, lambada, ...) are skipped.
    out2 = tmp_path / "zs2"
    assert (
        main(
            [
                "zeroshot",
                str(run),
                "--task",
                "all",
                "--data",
                str(data),
                "--out",
                str(out2),
                "--calibrate",
            ]
        )
        == 0
    )
    curve = json.loads((out2 / "curve.json").read_text())
    assert [c["updates"] for c in curve["checkpoints"].values()] == [10, 100]
    assert set(curve["checkpoints"]["step-100"]["tasks"]) == {"sst2", "dpr"}
    assert (out2 / "curve.png").stat().st_size > 1000
    table = (out2 / "curve.md").read_text()
    assert "| step-100 | 100 |" in table and "lambada" not in table.splitlines()[0]
    # Resume: a new checkpoint is evaluated, the finished ones are not.
    n_vocab = json.loads((run / "step-10/config.json").read_text())["model"]["vocab_size"]
    save_model(
        tiny_model(vocab=n_vocab, seed=1, n_positions=128), run / "step-1000", tmp_path / "vocab"
    )
    calls = []
    real = zc.evaluate_checkpoint
    monkeypatch.setattr(
        zc, "evaluate_checkpoint", lambda f, *a, **k: calls.append(f.name) or real(f, *a, **k)
    )
    zc.evaluate_run(run, ["sst2", "dpr"], data, out2, options=zc.ZeroshotOptions(calibrate=True))
    assert calls == ["step-1000"]


def test_cli_errors_are_one_line(tmp_path, capsys):
    from gpt1.cli import main

    run = make_run(tmp_path, steps=(1,))
    assert (
        main(
            [
                "zeroshot",
                str(run / "step-1"),
                "--task",
                "nope",
                "--data",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "zeroshot",
                str(run / "step-1"),
                "--task",
                "cola",
                "--data",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "unknown task" in err and "no cola data" in err


@pytest.mark.slow
def test_cli_on_shared_data_with_real_vocab(shared_data, tmp_path):
    """The real readers and GPT-1 vocabulary end to end, on a few examples per task."""
    from gpt1.cli import main

    vocab = shared_data / "gpt1_tokenizer"
    model = tiny_model(vocab=40478, n_positions=256, n_embd=16, n_head=2, n_layer=1)
    save_model(model, tmp_path / "ck", vocab)
    out = tmp_path / "o"
    assert (
        main(
            [
                "zeroshot",
                str(tmp_path / "ck"),
                "--task",
                "sst2,cola,story_cloze,lambada",
                "--data",
                str(shared_data),
                "--out",
                str(out),
                "--limit",
                "6",
            ]
        )
        == 0
    )
    tasks = json.loads((out / "results.json").read_text())["tasks"]
    assert set(tasks) == {"sst2", "cola", "story_cloze", "lambada"}
    assert all(t["n"] == 6 for t in tasks.values())
    assert tasks["sst2"]["pieces"] == {"negative": 1, "positive": 1}  # whole words in GPT-1's BPE


def test_run_checkpoints_score_final_once_when_it_repeats_the_last_step(tmp_path):
    import json as _json

    from gpt1.model.checkpoint import run_checkpoints

    for name, step in (("step-10", 10), ("step-20", 20), ("final", 20)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "trainer_state.json").write_text(_json.dumps({"step": step}))
    assert [c[0] for c in run_checkpoints(tmp_path)] == ["step-10", "step-20"]
    (tmp_path / "step-20" / "config.json").unlink()  # a final with no matching step-N stays
    assert [c[0] for c in run_checkpoints(tmp_path)] == ["step-10", "final"]


def test_a_final_whose_update_count_cannot_be_read_is_still_listed(tmp_path):
    """updates_of reads through the project's JSON reader: a 5,000-digit step (past Python's
    conversion limit) or a device is no count, not a ValueError traceback or a read forever."""
    from gpt1.model.checkpoint import run_checkpoints

    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    state = tmp_path / "final" / "trainer_state.json"
    state.write_text('{"step": ' + "9" * 5000 + "}")
    assert [c[:2] for c in run_checkpoints(tmp_path)] == [("final", None)]
    state.unlink()
    state.symlink_to("/dev/zero")
    assert [c[:2] for c in run_checkpoints(tmp_path)] == [("final", None)]


def test_scoring_stays_inside_the_pretrained_window(tmp_path):
    import json as _json

    import torch as _torch

    from gpt1 import GPT, ModelConfig, save_model
    from gpt1.checkpoint_files import trained_context

    model = GPT(ModelConfig(**{**TINIER_MODEL, "n_positions": 32}))
    save_model(model, tmp_path / "run" / "step-5")
    assert trained_context(tmp_path / "run" / "step-5") is None
    (tmp_path / "run" / "run.json").write_text(_json.dumps({"data": {"n_ctx": 16}}))
    assert trained_context(tmp_path / "run" / "step-5") == 16
    scorer = Scorer(model.eval(), max_context=16)
    ctx, cont = list(range(1, 21)), [3, 4]
    capped = scorer.score([(ctx, cont)])[0]
    assert scorer.truncated == 1
    # the same as scoring only the last 16 - 1 tokens of context by hand
    row = _torch.tensor([ctx[-15:] + cont[:-1]])
    logp = model.lm_logits(model(row)).log_softmax(-1)[0]
    expected = [logp[14, 3].item(), logp[15, 4].item()]
    assert capped.logprobs == pytest.approx(expected, abs=1e-5)
