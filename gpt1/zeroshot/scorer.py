"""Zero-shot evaluation: the paper's heuristics (§5, Fig. 2 right) and a batched, selective scorer.

Owns three things:

* `Scorer`: scores `(context ids, continuation ids)` requests. It runs the decoder once per batch of
  right-padded rows and applies the tied output layer only at the positions whose next token is
  scored (the last position for SST-2, the answer/continuation tokens for RACE, DPR, Story Cloze
  and LAMBADA). Identical rows, and rows that are a prefix of another row, share one forward pass.
  Rows are length-sorted and packed under a token budget, so padding stays small.
* The heuristics, exactly as a.11 of the reference defines them (`TASKS`):
  - sst2: append "very", restrict the next-token distribution to "positive" / "negative". A word
    the BPE splits into several pieces is scored by the SUM of its pieces' log-probabilities
    (the log-probability of the whole word), so the comparison stays a comparison of two words.
  - cola: mean token log-probability of the sentence (tokens 2..n, since GPT-1 has no start-of-text
    token for pretraining), thresholded; the threshold maximises Matthews correlation on the
    TRAINING split and is reported with the dev score.
  - race: per answer, mean log-probability of the answer tokens given document + question.
  - dpr: substitute each candidate for the pronoun (its first whole-word occurrence); the candidate
    under which the rest of the sentence has the higher mean log-probability wins.
  - story_cloze (extra): the ending with the higher mean token log-probability given the story.
  - lambada (extra): last-word accuracy = every piece of the last word is the greedy prediction.
  - `calibrate=True` (beyond the paper; contextual calibration, Zhao et al. 2021): each candidate's
    log-probability minus its log-probability after the content-free input "N/A" in the same
    template. Not applicable to cola (its threshold already calibrates) or lambada (no candidates).
* `normalised()`: Fig. 2's scale, 0 = chance and 1 = the reference state of the art in `REFERENCES`.

Entry points: `evaluate_checkpoint` (one checkpoint, many tasks) and `evaluate_run` (every
`step-N` / `final` checkpoint of a pretraining run -> table + PNG of normalised score vs updates).
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gpt1.zeroshot import data as zd
from gpt1.errors import CheckpointError, ConfigError, DataError, Gpt1Error
from gpt1.files import OutputExists, write_json, write_text
from gpt1.train.telemetry import save_figure
from gpt1.model.inplace import log_softmax_
from gpt1.train.objectives import aligned_logits, logits_width
from gpt1.tasks.examples import ChoiceExample

log = logging.getLogger(__name__)

CONTENT_FREE = "N/A"


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


# ----------------------------------------------------------------------------- normalisation
@dataclass(frozen=True)
class Reference:
    metric: str
    chance: float
    sota: float
    source: str


# Fig. 2 normalises so that 0 = random guessing and 1 = the state of the art at the time (2018).
REFERENCES: dict[str, Reference] = {
    "sst2": Reference("accuracy", 0.5, 0.932, "Sparse byte mLSTM (Radford et al. 2017), paper Table 4"),
    "cola": Reference("mcc", 0.0, 0.350, "single-task BiLSTM + ELMo + Attn (GLUE), paper Table 4"),
    "race": Reference("accuracy", 0.25, 0.533, "BiAttention MRU (9x), paper Table 3"),
    "dpr": Reference("accuracy", 0.5, 0.7641,
                     "Peng, Khashabi & Roth 2015 on Rahman & Ng's DPR test set"),
    "story_cloze": Reference("accuracy", 0.5, 0.776, "Hidden Coherence Model, paper Table 3"),
    # Not a paper task: anchored on GPT-2 1.5B's zero-shot LAMBADA accuracy (Radford et al. 2019),
    # a later model, because no 2018 state of the art for this plain-text variant exists.
    "lambada": Reference("accuracy", 0.0, 0.6324, "GPT-2 1.5B zero-shot (2019), not 2018 SOTA"),
}


def normalised(task: str, value: float) -> float:
    """Fig. 2's scale: (value - chance) / (reference - chance): 0 = chance, 1 = reference SOTA."""
    ref = REFERENCES[task]
    return (value - ref.chance) / (ref.sota - ref.chance)


# ------------------------------------------------------------------------------------ scorer
@dataclass
class Score:
    """Per-token log-probabilities of one continuation and, when asked for, whether every token
    was the argmax of its next-token distribution (None when not asked for)."""
    logprobs: list[float]
    greedy: bool | None

    @property
    def total(self) -> float:
        return float(sum(self.logprobs))

    @property
    def mean(self) -> float:
        return self.total / len(self.logprobs) if self.logprobs else float("-inf")


class Scorer:
    """Batched log-probability scoring of continuations with a `GPT` or `LSTMLM` (module doc)."""

    def __init__(self, model: torch.nn.Module, batch_tokens: int = 4096, max_rows: int = 64,
                 logits_chunk: int = 1024, max_context: int | None = None):
        self.model = model.eval()
        # Rows never exceed the positions the model has (or, if smaller, was trained on).
        self.n_positions = min(model.config.n_positions, max_context or model.config.n_positions)
        self.batch_tokens, self.max_rows, self.logits_chunk = batch_tokens, max_rows, logits_chunk
        self.truncated = 0   # requests cut to fit n_positions (see `_plan`)
        self._logits_buffers: dict[torch.dtype, torch.Tensor] = {}   # reused [logits_chunk, V]

    def _plan(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]):
        """Rows to run (prefix-shared) and, per request, (row index, first position, targets)."""
        rows: dict[tuple[int, ...], int] = {}
        plans: list[tuple[tuple[int, ...], int, list[int]] | None] = []
        for ctx, cont in requests:
            ctx, cont = list(ctx), list(cont)
            if not cont:
                plans.append(None)
                continue
            if not ctx:
                raise ValueError("a continuation needs at least one context token to be scored")
            n_tokens = len(ctx) + len(cont)
            # A continuation longer than the context window keeps its first n_positions
            # tokens after one context token (the row is that token + all but the last
            # continuation token); a long context loses tokens on the left.
            cont = cont[:self.n_positions]
            room = self.n_positions - len(cont) + 1   # the row is ctx + cont[:-1]
            ctx = ctx[-room:]
            if len(ctx) + len(cont) < n_tokens:
                self.truncated += 1   # reported with the results
            key = tuple(ctx + cont[:-1])
            rows.setdefault(key, len(rows))
            plans.append((key, len(ctx) - 1, cont))
        # In lexicographic order a row that is a prefix of any other row is a prefix of its
        # successor, so one backward pass maps every row to the longest row that contains it.
        ordered = sorted(rows)
        canon: dict[tuple[int, ...], tuple[int, ...]] = {}
        for i in range(len(ordered) - 1, -1, -1):
            row = ordered[i]
            nxt = ordered[i + 1] if i + 1 < len(ordered) else None
            canon[row] = canon[nxt] if nxt is not None and nxt[:len(row)] == row else row
        return plans, canon

    @torch.inference_mode()
    def score(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]],
              greedy: bool = False) -> list[Score]:
        """One `Score` per request; an empty continuation gets an empty `Score`.

        `greedy` also checks each scored token against the argmax (one more pass over the logits).
        """
        plans, canon = self._plan(requests)
        # Per canonical row: position -> the target tokens scored there (usually one).
        wanted: dict[tuple[int, ...], dict[int, set[int]]] = {}
        for plan in plans:
            if plan is not None:
                key, start, cont = plan
                positions = wanted.setdefault(canon[key], {})
                for offset, target in enumerate(cont):
                    positions.setdefault(start + offset, set()).add(target)
        results: dict[tuple[tuple[int, ...], int, int], tuple[float, bool]] = {}
        for batch in self._batches(sorted(wanted, key=len, reverse=True)):
            self._run(batch, wanted, results, greedy)
        if any(lp != lp for lp, _ in results.values()):   # NaN: argmax would pick silently
            raise Gpt1Error("the model produced NaN log-probabilities (overflow in this dtype, "
                            "or damaged weights); scores would be meaningless")
        out: list[Score] = []
        for plan in plans:
            if plan is None:
                out.append(Score([], True if greedy else None))
                continue
            key, start, cont = plan
            pairs = [results[(canon[key], start + i, t)] for i, t in enumerate(cont)]
            out.append(Score([lp for lp, _ in pairs],
                             all(g for _, g in pairs) if greedy else None))
        return out

    def _log_probs(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Log-softmax of the output layer at `hidden` `[n, C]` -> `[n, >= V]`, fp32 even in bf16.

        Columns past V (if any) hold -inf: index the result with token ids only.

        On CPU the logits land in reused buffers and the log-softmax overwrites them in place: a
        fresh `[n, V]` tensor (166 MB for 1,024 rows of GPT-1's vocabulary in fp32, 83 MB in
        bf16) costs a page fault per 4 KiB, and logsumexp's own temporary as much again. The
        fp32 buffer's rows are `logits_width` long (aligned: see `gpt1.train.objectives`). 16-bit
        logits go through a 16-bit buffer, upcast once into the fp32 one. The result is a view of
        the fp32 buffer, valid until the next call.
        """
        if hidden.device.type != "cpu":
            return torch.log_softmax(F.linear(hidden, weight).float(), dim=-1)
        n, V = hidden.shape[0], weight.shape[0]
        out = self._buffer(torch.float32, n, logits_width(V, torch.float32))   # [n, width]
        if hidden.dtype == weight.dtype == torch.float32:
            aligned_logits(hidden, weight, out=out)
        else:   # 16-bit logits (their rows stay V long), upcast once into the fp32 rows
            low = (aligned_logits(hidden, weight, out=self._buffer(hidden.dtype, n, V))
                   if hidden.dtype == weight.dtype else F.linear(hidden, weight))   # [n, V]
            out[:, :V].copy_(low)
            out[:, V:] = -math.inf                    # exp(-inf) = 0: the softmax ignores them
        return log_softmax_(out, 1)

    def _buffer(self, dtype: torch.dtype, n: int, width: int) -> torch.Tensor:
        """The first `n` rows of this scorer's reused `[>= n, width]` buffer of `dtype`."""
        buf = self._logits_buffers.get(dtype)
        if buf is None or buf.shape[1] != width or buf.shape[0] < n:
            buf = self._logits_buffers[dtype] = torch.empty(max(n, self.logits_chunk), width,
                                                            dtype=dtype)
        return buf[:n]

    def _batches(self, rows: list[tuple[int, ...]]):
        batch: list[tuple[int, ...]] = []
        for row in rows:   # longest first, so the first row of a batch sets its width
            if batch and ((len(batch) + 1) * len(batch[0]) > self.batch_tokens
                          or len(batch) >= self.max_rows):
                yield batch
                batch = []
            batch.append(row)
        if batch:
            yield batch

    def _run(self, batch, wanted, results, greedy: bool) -> None:
        device = self.model.wte.weight.device
        B, T = len(batch), len(batch[0])
        ids = torch.zeros(B, T, dtype=torch.long)   # right padding never reaches earlier positions
        for b, row in enumerate(batch):
            ids[b, :len(row)] = torch.tensor(row)
        # Rows are right-padded: the model skips the padding in its position-wise layers.
        lengths = torch.tensor([len(row) for row in batch], device=device)
        hidden = self.model(ids.to(device), lengths=lengths)       # [B, T, C]
        positions = [(b, pos) for b, row in enumerate(batch) for pos in sorted(wanted[batch[b]])]
        flat = torch.tensor([b * T + pos for b, pos in positions], device=device)
        picked = hidden.reshape(B * T, -1).index_select(0, flat)   # [N, C]
        weight = self.model.lm_weight()
        for lo in range(0, len(positions), self.logits_chunk):
            chunk = positions[lo:lo + self.logits_chunk]
            logp_all = self._log_probs(picked[lo:lo + len(chunk)], weight)   # [n, V] fp32
            triples = [(i, t) for i, (b, pos) in enumerate(chunk) for t in wanted[batch[b]][pos]]
            rows = torch.tensor([i for i, _ in triples], device=device)
            targets = torch.tensor([t for _, t in triples], device=device)
            # Only the scored entries leave the chunk.
            logp = logp_all[rows, targets].tolist()
            if greedy:   # the argmax of the log-probabilities is the argmax of the logits
                hit = (logp_all.argmax(dim=-1)[rows] == targets).tolist()
            else:
                hit = [None] * len(triples)
            for (i, t), lp, g in zip(triples, logp, hit):
                b, pos = chunk[i]
                results[(batch[b], pos, t)] = (lp, g)


# -------------------------------------------------------------------------------- heuristics
def _pick(scores: np.ndarray) -> np.ndarray:
    """Index of the best candidate per example; scores `[n, n_candidates]`."""
    return np.asarray(scores).argmax(axis=1)


def _candidate_scores(scorer: Scorer, contexts: list[list[int]], candidates: list[list[list[int]]],
                      reduce: str) -> np.ndarray:
    """`[n, k]` summed or mean log-probabilities of candidate k after context n."""
    reqs = [(ctx, cand) for ctx, cands in zip(contexts, candidates) for cand in cands]
    scored = scorer.score(reqs)
    values = [s.total if reduce == "sum" else s.mean for s in scored]
    k = len(candidates[0]) if candidates else 0
    return np.asarray(values, dtype=np.float64).reshape(len(contexts), k)


def zs_sst2(scorer: Scorer, tok: TextEncoder, examples: list[tuple[str, int]],
            calibrate: bool = False) -> dict[str, Any]:
    words = [tok.encode("negative"), tok.encode("positive")]   # index = label
    unk = getattr(tok, "unk_id", None)
    if unk is not None and any(unk in w for w in words):
        log.warning("sst2: this vocabulary spells 'positive' or 'negative' with <unk>; the "
                    "comparison is meaningless")
    contexts = [tok.encode(sentence + " very") for sentence, _ in examples]
    scores = _candidate_scores(scorer, contexts, [words] * len(contexts), "sum")
    if calibrate:
        scores = scores - _candidate_scores(scorer, [tok.encode(CONTENT_FREE + " very")],
                                            [words], "sum")
    pred = _pick(scores)
    labels = np.array([label for _, label in examples])
    return {"accuracy": float((pred == labels).mean()), "predicted_positive": float(pred.mean()),
            "pieces": {"negative": len(words[0]), "positive": len(words[1])}}


def sentence_scores(scorer: Scorer, tok: TextEncoder, sentences: list[str]) -> np.ndarray:
    """Mean log-probability of tokens 2..n of each sentence (-inf when it has one token)."""
    ids = [tok.encode(s) for s in sentences]
    scored = scorer.score([(t[:1], t[1:]) if t else ([], []) for t in ids])
    return np.array([s.mean for s in scored], dtype=np.float64)


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(threshold, MCC): predicting 1 when score >= threshold maximises MCC on these examples.

    Candidate thresholds lie between consecutive distinct scores (plus +inf: all predicted 0).
    """
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels[order].astype(np.float64)
    P, N = y.sum(), len(y) - y.sum()
    tp = np.concatenate([[0.0], np.cumsum(y)])          # top-k predicted 1, k = 0..n
    k = np.arange(len(y) + 1, dtype=np.float64)
    fp, fn = k - tp, P - tp
    tn = N - fp
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    mcc = np.where(denom > 0, (tp * tn - fp * fn) / np.where(denom > 0, denom, 1.0), 0.0)
    # Cutting between equal scores is impossible: only k where s[k-1] > s[k] (or the ends) count.
    valid = np.ones(len(y) + 1, dtype=bool)
    valid[1:-1] = s[:-1] > s[1:]
    mcc = np.where(valid, mcc, -np.inf)
    best = int(np.argmax(mcc))
    if best == 0:
        threshold = math.inf
    elif best == len(y):
        threshold = -math.inf
    else:
        threshold = float((s[best - 1] + s[best]) / 2)
    return threshold, float(mcc[best])


def zs_cola(scorer: Scorer, tok: TextEncoder, train: list[tuple[str, int]],
            dev: list[tuple[str, int]], calibrate: bool = False) -> dict[str, Any]:
    from sklearn.metrics import matthews_corrcoef
    tr_scores = sentence_scores(scorer, tok, [s for s, _ in train])
    threshold, train_mcc = best_threshold(tr_scores, np.array([y for _, y in train]))
    dev_scores = sentence_scores(scorer, tok, [s for s, _ in dev])
    pred = (dev_scores >= threshold).astype(int)
    labels = np.array([y for _, y in dev])
    return {"mcc": float(matthews_corrcoef(labels, pred)), "threshold": threshold,
            "train_mcc": train_mcc, "n_train": len(train),
            "accuracy": float((pred == labels).mean())}


def zs_race(scorer: Scorer, tok: TextEncoder, examples: list[ChoiceExample],
            calibrate: bool = False) -> dict[str, Any]:
    contexts = [tok.encode(ex.context + " " + ex.question) for ex in examples]
    cands = [[tok.encode(o) for o in ex.choices] for ex in examples]
    scores = _candidate_scores(scorer, contexts, cands, "mean")
    if calibrate:
        cf = tok.encode(CONTENT_FREE)
        scores = scores - _candidate_scores(scorer, [cf] * len(cands), cands, "mean")
    labels = np.array([ex.label for ex in examples])
    return {"accuracy": float((_pick(scores) == labels).mean())}


def dpr_requests(tok: TextEncoder, ex: zd.DprExample, prefix_override: str | None = None):
    """Per candidate: (context = sentence up to and including the candidate, rest of sentence)."""
    at = zd.find_word(ex.sentence, ex.pronoun)
    before, after = ex.sentence[:at], ex.sentence[at + len(ex.pronoun):]
    out = []
    for cand in ex.candidates:
        prefix = (before if prefix_override is None else prefix_override) + cand
        # Encoding the two halves separately keeps the scored tokens identical for both
        # candidates; GPT-1's BPE works word by word, so this equals encoding the whole sentence
        # except where spaCy would merge across the boundary.
        out.append((tok.encode(prefix), tok.encode(after)))
    return out


def zs_dpr(scorer: Scorer, tok: TextEncoder, examples: list[zd.DprExample],
           calibrate: bool = False) -> dict[str, Any]:
    def mean_scores(override: str | None) -> np.ndarray:
        reqs = [r for ex in examples for r in dpr_requests(tok, ex, override)]
        return np.array([s.mean for s in scorer.score(reqs)]).reshape(len(examples), 2)
    scores = mean_scores(None)
    if calibrate:
        scores = scores - mean_scores(CONTENT_FREE + " ")
    labels = np.array([ex.answer for ex in examples])
    return {"accuracy": float((_pick(scores) == labels).mean())}


def zs_story_cloze(scorer: Scorer, tok: TextEncoder, examples: list[ChoiceExample],
                   calibrate: bool = False) -> dict[str, Any]:
    contexts = [tok.encode(ex.context) for ex in examples]
    cands = [[tok.encode(e) for e in ex.choices] for ex in examples]
    scores = _candidate_scores(scorer, contexts, cands, "mean")
    if calibrate:
        scores = scores - _candidate_scores(scorer, [tok.encode(CONTENT_FREE)] * len(cands),
                                            cands, "mean")
    labels = np.array([ex.label for ex in examples])
    return {"accuracy": float((_pick(scores) == labels).mean())}


def zs_lambada(scorer: Scorer, tok: TextEncoder, examples: list[tuple[str, str]],
               calibrate: bool = False) -> dict[str, Any]:
    targets = [tok.encode(word) for _, word in examples]
    scored = scorer.score([(tok.encode(ctx), t) for (ctx, _), t in zip(examples, targets)],
                          greedy=True)
    # A target holding the unknown token cannot have been predicted: it counts as a miss (a
    # vocabulary without the word would otherwise "predict" <unk> <unk> perfectly).
    unk = getattr(tok, "unk_id", None)
    has_unk = [unk is not None and unk in t for t in targets]
    total = sum(len(s.logprobs) for s in scored)
    return {"accuracy": float(np.mean([s.greedy and not u for s, u in zip(scored, has_unk)])),
            "unknown_targets": int(sum(has_unk)),
            "word_perplexity": float(math.exp(-sum(s.total for s in scored) / len(scored))),
            "token_perplexity": float(math.exp(-sum(s.total for s in scored) / max(total, 1)))}


# ------------------------------------------------------------------------------- task table
@dataclass(frozen=True)
class TaskSpec:
    folders: tuple[str, ...]      # where the task lives under a data root
    load: Callable[[Path, int | None], dict[str, Any]]   # folder, limit -> heuristic kwargs
    run: Callable[..., dict[str, Any]]


def _first(folder: Path, patterns: Sequence[str]) -> Path:
    for pattern in patterns:
        hits = sorted(folder.glob(pattern))
        if hits:
            return hits[0]
    raise DataError(f"no file matching {' or '.join(patterns)}", folder)


def _cut(items: list, limit: int | None) -> list:
    return items if limit is None else items[:limit]


def _read_split(task: str, folder: Path, splits: Sequence[str]):
    """The first of `splits` that `gpt1.tasks` finds in `folder`, and the file it came from."""
    from gpt1.tasks.registry import get_task
    for i, split in enumerate(splits):
        try:
            read = get_task(task).read(folder, split)
        except DataError:
            if i == len(splits) - 1:
                raise
            continue
        return read.examples, read.path


def _load_text(task: str, split: str):
    def load(folder: Path, limit: int | None) -> dict[str, Any]:
        examples, path = _read_split(task, folder, [split])
        return {"examples": _cut([(e.text, int(e.label)) for e in examples], limit),
                "file": str(path)}
    return load


def _load_cola(folder: Path, limit: int | None) -> dict[str, Any]:
    train, _ = _read_split("cola", folder, ["train"])
    dev, path = _read_split("cola", folder, ["dev"])
    return {"train": _cut([(e.text, int(e.label)) for e in train], limit),
            "dev": _cut([(e.text, int(e.label)) for e in dev], limit), "file": str(path)}


def _load_choice(task: str, splits: Sequence[str]):
    def load(folder: Path, limit: int | None) -> dict[str, Any]:
        examples, path = _read_split(task, folder, splits)
        return {"examples": _cut(examples, limit), "file": str(path)}
    return load


def _file_loader(patterns: Sequence[str], reader: Callable[[Path], list]):
    def load(folder: Path, limit: int | None) -> dict[str, Any]:
        file = _first(folder, patterns)
        return {"examples": _cut(reader(file), limit), "file": str(file)}
    return load


# Splits: SST-2 and CoLA dev (CoLA's threshold from train), Story Cloze and RACE test (RACE dev
# when there is no test), DPR test.c.txt, the LAMBADA test passages.
TASKS: dict[str, TaskSpec] = {
    "sst2": TaskSpec(("glue/SST-2", "SST-2", "sst2"), _load_text("sst2", "dev"), zs_sst2),
    "cola": TaskSpec(("glue/CoLA", "CoLA", "cola"), _load_cola, zs_cola),
    "race": TaskSpec(("RACE", "race"), _load_choice("race", ["test", "dev"]), zs_race),
    "dpr": TaskSpec(("dpr", "DPR"), _file_loader(["test.c.txt"], zd.read_dpr), zs_dpr),
    "story_cloze": TaskSpec(("story_cloze", "ROCStories"), _load_choice("story_cloze", ["test"]),
                            zs_story_cloze),
    "lambada": TaskSpec(("corpus/lambada", "lambada"), _file_loader(["*.txt"], zd.read_lambada),
                        zs_lambada),
}
MARKERS = {"sst2": "dev.tsv", "cola": "train.tsv", "race": None, "dpr": "test.c.txt",
           "story_cloze": "*.csv", "lambada": "*.txt"}


def task_folder(task: str, data: Path) -> Path | None:
    """`data` itself when it holds the task's files, else its standard subfolder, else None."""
    data = Path(data)
    marker = MARKERS[task]
    if task == "race":
        if any(data.glob("*.jsonl")) or (data / "test").is_dir() or (data / "dev").is_dir():
            return data
    elif any(data.glob(marker)):
        return data
    for sub in TASKS[task].folders:
        if (data / sub).is_dir():
            return data / sub
    return None


def parse_tasks(spec: str) -> list[str]:
    names = list(TASKS) if spec == "all" else [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ConfigError(f"unknown task(s) {', '.join(unknown) or spec!r}; choose from "
                          f"{', '.join(TASKS)} or 'all'")
    return names


def run_task(task: str, scorer: Scorer, tok: TextEncoder, folder: Path, limit: int | None = None,
             calibrate: bool = False) -> dict[str, Any]:
    """Read the task's data from `folder`, apply its heuristic, add n / normalised score."""
    kwargs = TASKS[task].load(Path(folder), limit)
    file = kwargs.pop("file")
    n = len(kwargs.get("examples", kwargs.get("dev", [])))
    if n == 0:
        raise DataError(f"no {task} examples", file)
    start, scorer.truncated = time.perf_counter(), 0
    result = TASKS[task].run(scorer, tok, calibrate=calibrate, **kwargs)
    ref = REFERENCES[task]
    result.update({"task": task, "metric": ref.metric, "value": result[ref.metric],
                   "normalised": normalised(task, result[ref.metric]), "n": n,
                   "chance": ref.chance, "reference": ref.sota, "reference_source": ref.source,
                   "calibrated": calibrate and task not in ("cola", "lambada"), "file": file,
                   "truncated": scorer.truncated, "context": scorer.n_positions,
                   "seconds": time.perf_counter() - start})
    return result


# -------------------------------------------------------------------------- entry points
def _prepare_model(checkpoint: Path, device: str, precision: str) -> torch.nn.Module:
    """A GPT or LSTM checkpoint (by its recorded architecture), in eval mode and `precision`
    (device and precision may be "auto": see gpt1.devices)."""
    from gpt1.devices import resolve_device, resolve_precision, torch_dtype
    from gpt1.model.registry import load_any_checkpoint
    where = resolve_device(device)
    dtype = torch_dtype(resolve_precision(precision, where))
    return load_any_checkpoint(checkpoint, device=where).to(dtype).eval()


def evaluate_checkpoint(checkpoint: str | Path, tasks: Sequence[str], data: str | Path,
                        tokenizer_dir: str | Path | None = None, limit: int | None = None,
                        calibrate: bool = False, device: str = "auto", precision: str = "auto",
                        batch_tokens: int = 4096) -> dict[str, dict[str, Any]]:
    """Results per task for one checkpoint; tasks without data under `data` are skipped (logged)."""
    from gpt1.model.checkpoint import resolve_checkpoint_dir, tokenizer_dir_of
    folder = resolve_checkpoint_dir(checkpoint)
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else tokenizer_dir_of(folder)
    if tok_dir is None:
        raise CheckpointError(f"{folder}: no tokenizer files (vocab.json + merges.txt); "
                              "pass --tokenizer DIR")
    folders = {t: task_folder(t, Path(data)) for t in tasks}
    missing = [t for t, f in folders.items() if f is None]
    if missing and len(tasks) == 1:
        raise DataError(f"no {tasks[0]} data here (looked for it and in "
                        f"{', '.join(TASKS[tasks[0]].folders)})", data)
    for t in missing:
        log.info("zeroshot: skipping %s (no data under %s)", t, data)
    from gpt1.text.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(tok_dir)
    from gpt1.model.checkpoint import trained_context
    scorer = Scorer(_prepare_model(folder, device, precision), batch_tokens=batch_tokens,
                    max_context=trained_context(folder))
    if scorer.n_positions < scorer.model.config.n_positions:
        log.info("zeroshot: context capped at %d tokens, the window %s was pretrained on",
                 scorer.n_positions, folder.name)
    results = {}
    for task in tasks:
        if folders[task] is not None:
            results[task] = run_task(task, scorer, tok, folders[task], limit, calibrate)
            r = results[task]
            log.info("zeroshot %s %s: %s %.4f (normalised %.3f, n=%d, %.1fs)", folder.name, task,
                     r["metric"], r["value"], r["normalised"], r["n"], r["seconds"])
    return results


def run_checkpoints(run_dir: str | Path) -> list[tuple[str, int | None, Path]]:
    """(name, pretraining updates, folder) for every step-N and final checkpoint of a run."""
    run_dir = Path(run_dir)
    found = []
    for p in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        if not (p / "config.json").is_file() or p.name.startswith("."):
            continue
        m = re.fullmatch(r"step-(\d+)", p.name)
        if m:
            found.append((p.name, int(m.group(1)), p))
        elif p.name == "final":
            found.append((p.name, _updates_of(p), p))
    if not found:
        raise CheckpointError(f"{run_dir}: no step-N or final checkpoints in this run folder")
    # `final` usually repeats the last step-N (same update count): score those weights once.
    steps = {c[1] for c in found if c[0] != "final"}
    found = [c for c in found if not (c[0] == "final" and c[1] is not None and c[1] in steps)]
    return sorted(found, key=lambda c: (c[1] is None, c[1] or 0, c[0]))


def _updates_of(folder: Path) -> int | None:
    """The update count a checkpoint records (trainer_state.json, else config.json), if any."""
    for name in ("trainer_state.json", "config.json"):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        for table in (data, data.get("trainer") or {}):
            for key in ("step", "updates", "global_step"):
                # type(): a JSON true is not an update count
                if isinstance(table, dict) and type(table.get(key)) is int and table[key] >= 0:
                    return table[key]
    return None


def evaluate_run(run_dir: str | Path, tasks: Sequence[str], data: str | Path, out_dir: str | Path,
                 overwrite: bool = False, **settings: Any) -> dict[str, Any]:
    """Zero-shot over a pretraining run (Fig. 2 right): every checkpoint, every task with data.

    Resumable: results accumulate in OUT/curve.json after each checkpoint, and a rerun with the
    same settings evaluates only what is missing. Writes curve.md (table) and curve.png. A
    curve.json with other settings (or curve files without one) is replaced only with `overwrite`.
    """
    out_dir = Path(out_dir)
    cache_file = out_dir / "curve.json"
    key = {"limit": settings.get("limit"), "calibrate": bool(settings.get("calibrate", False)),
           "precision": _resolved_precision(settings)}
    curve: dict[str, Any] = {"settings": key, "data": str(data), "checkpoints": {}}
    old = _read_curve(cache_file) if cache_file.is_file() else None
    if old is not None and old.get("settings") == key:
        curve = old
    elif not overwrite:
        for name in ("curve.json", "curve.md", "curve.png"):
            if (out_dir / name).exists():
                raise OutputExists(f"{out_dir / name}: exists from a curve with other settings "
                                   f"({old.get('settings') if old else 'unknown'}, now {key}); "
                                   "pass --overwrite to start afresh, or choose another --out")
    for name, updates, folder in run_checkpoints(run_dir):
        done = curve["checkpoints"].get(name, {"updates": updates, "tasks": {}})
        todo = [t for t in tasks if t not in done["tasks"]]
        if todo:
            done["tasks"].update(evaluate_checkpoint(folder, todo, data, **settings))
            done["updates"] = updates
            curve["checkpoints"][name] = done
            write_json(cache_file, curve, indent=1)  # a killed sweep keeps every finished checkpoint
    shown = [t for t in tasks if any(t in e["tasks"] for e in curve["checkpoints"].values())]
    write_text(out_dir / "curve.md", curve_table(curve, shown))
    plot_curve(curve, shown, out_dir / "curve.png")
    return curve


def _read_curve(file: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
def _resolved_precision(settings: dict[str, Any]) -> str:
    """The precision a sweep runs in, as a concrete name (its results depend on it)."""
    from gpt1.devices import resolve_device, resolve_precision
    return resolve_precision(settings.get("precision", "auto"),
                             resolve_device(settings.get("device", "auto")))


def curve_table(curve: dict[str, Any], tasks: Sequence[str]) -> str:
    """Markdown: one row per checkpoint, normalised score (raw metric) per task."""
    lines = ["| checkpoint | updates | " + " | ".join(tasks) + " |",
             "|---|---|" + "---|" * len(tasks)]
    for name, entry in curve["checkpoints"].items():
        cells = []
        for t in tasks:
            r = entry["tasks"].get(t)
            cells.append("–" if r is None else f"{r['normalised']:.3f} ({r['metric']} {r['value']:.3f})")
        updates = "?" if entry["updates"] is None else str(entry["updates"])
        lines.append(f"| {name} | {updates} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Normalised: 0 = chance, 1 = reference state of the art ("
                 + "; ".join(f"{t}: {REFERENCES[t].sota} {REFERENCES[t].metric}, "
                             f"{REFERENCES[t].source}" for t in tasks) + ").")
    return "\n".join(lines) + "\n"


def plot_curve(curve: dict[str, Any], tasks: Sequence[str], png: Path) -> None:
    """Normalised score against pretraining updates (log x axis), one line per task."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in tasks:
        pts = sorted((e["updates"], e["tasks"][t]["normalised"])
                     for e in curve["checkpoints"].values()
                     if t in e["tasks"] and e["updates"] is not None and e["updates"] > 0)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining updates")
    ax.set_ylabel("zero-shot score (0 = chance, 1 = SOTA)")
    ax.set_title("Zero-shot performance over pretraining")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png)
    plt.close(fig)
