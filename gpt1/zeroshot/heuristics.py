"""The paper's zero-shot heuristics (§5, Fig. 2 right), one per task, and the zero-shot task table.

The heuristics, exactly as a.11 of the reference defines them:

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

`normalised()` puts a result on Fig. 2's scale: 0 = chance and 1 = the reference state of the art
in `REFERENCES`.

`TASKS` is the zero-shot task table: per task, its heuristic, how to load its examples and where
it lives under a data root. Tasks that `gpt1.tasks.registry` knows (sst2, cola, race, story_cloze)
take their name, their readers and their standard folders from the registry; only DPR and LAMBADA,
which have no fine-tuning form, read their files through `gpt1.zeroshot.data`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpt1.errors import ConfigError, DataError
from gpt1.inference.scoring import Scorer
from gpt1.tasks.examples import ChoiceExample
from gpt1.tasks.registry import get_task
from gpt1.zeroshot import data as zd

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
    "sst2": Reference(
        "accuracy", 0.5, 0.932, "Sparse byte mLSTM (Radford et al. 2017), paper Table 4"
    ),
    "cola": Reference("mcc", 0.0, 0.350, "single-task BiLSTM + ELMo + Attn (GLUE), paper Table 4"),
    "race": Reference("accuracy", 0.25, 0.533, "BiAttention MRU (9x), paper Table 3"),
    "dpr": Reference(
        "accuracy", 0.5, 0.7641, "Peng, Khashabi & Roth 2015 on Rahman & Ng's DPR test set"
    ),
    "story_cloze": Reference("accuracy", 0.5, 0.776, "Hidden Coherence Model, paper Table 3"),
    # Not a paper task: anchored on GPT-2 1.5B's zero-shot LAMBADA accuracy (Radford et al. 2019),
    # a later model, because no 2018 state of the art for this plain-text variant exists.
    "lambada": Reference("accuracy", 0.0, 0.6324, "GPT-2 1.5B zero-shot (2019), not 2018 SOTA"),
}


def normalised(task: str, value: float) -> float:
    """Fig. 2's scale: (value - chance) / (reference - chance): 0 = chance, 1 = reference SOTA."""
    ref = REFERENCES[task]
    return (value - ref.chance) / (ref.sota - ref.chance)


# -------------------------------------------------------------------------------- heuristics
def _pick(scores: np.ndarray) -> np.ndarray:
    """Index of the best candidate per example; scores `[n, n_candidates]`."""
    return np.asarray(scores).argmax(axis=1)


def choice_rows(
    scores: np.ndarray, choices: list[list[str]], gold: np.ndarray
) -> list[dict[str, Any]]:
    """One record per example (`--out`'s JSONL): its position in the file as read (after
    --limit), the chosen answer, every choice with its score (as the heuristic compared them,
    calibrated when asked) and the gold answer."""
    return [
        {
            "id": i,
            "answer": names[int(np.argmax(row))],
            "choices": names,
            "scores": [float(v) for v in row],
            "gold": names[int(g)],
        }
        for i, (row, names, g) in enumerate(zip(scores, choices, gold))
    ]


def _candidate_scores(
    scorer: Scorer, contexts: list[list[int]], candidates: list[list[list[int]]], reduce: str
) -> np.ndarray:
    """`[n, k]` summed or mean log-probabilities of candidate k after context n."""
    reqs = [(ctx, cand) for ctx, cands in zip(contexts, candidates) for cand in cands]
    scored = scorer.score(reqs)
    values = [s.total if reduce == "sum" else s.mean for s in scored]
    k = len(candidates[0]) if candidates else 0
    return np.asarray(values, dtype=np.float64).reshape(len(contexts), k)


def zs_sst2(
    scorer: Scorer, tok: TextEncoder, examples: list[tuple[str, int]], calibrate: bool = False
) -> dict[str, Any]:
    words = [tok.encode("negative"), tok.encode("positive")]  # index = label
    unk = getattr(tok, "unk_id", None)
    if unk is not None and any(unk in w for w in words):
        log.warning(
            "sst2: this vocabulary spells 'positive' or 'negative' with <unk>; the "
            "comparison is meaningless"
        )
    contexts = [tok.encode(sentence + " very") for sentence, _ in examples]
    scores = _candidate_scores(scorer, contexts, [words] * len(contexts), "sum")
    if calibrate:
        scores = scores - _candidate_scores(
            scorer, [tok.encode(CONTENT_FREE + " very")], [words], "sum"
        )
    pred = _pick(scores)
    labels = np.array([label for _, label in examples])
    return {
        "accuracy": float((pred == labels).mean()),
        "predicted_positive": float(pred.mean()),
        "pieces": {"negative": len(words[0]), "positive": len(words[1])},
        "examples": choice_rows(scores, [["negative", "positive"]] * len(scores), labels),
    }


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
    tp = np.concatenate([[0.0], np.cumsum(y)])  # top-k predicted 1, k = 0..n
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


def zs_cola(
    scorer: Scorer,
    tok: TextEncoder,
    train: list[tuple[str, int]],
    dev: list[tuple[str, int]],
    calibrate: bool = False,
) -> dict[str, Any]:
    from sklearn.metrics import matthews_corrcoef

    tr_scores = sentence_scores(scorer, tok, [s for s, _ in train])
    threshold, train_mcc = best_threshold(tr_scores, np.array([y for _, y in train]))
    dev_scores = sentence_scores(scorer, tok, [s for s, _ in dev])
    pred = (dev_scores >= threshold).astype(int)
    labels = np.array([y for _, y in dev])
    names = ["unacceptable", "acceptable"]  # CoLA's 0 and 1
    return {
        "mcc": float(matthews_corrcoef(labels, pred)),
        "threshold": threshold,
        "train_mcc": train_mcc,
        "n_train": len(train),
        "accuracy": float((pred == labels).mean()),
        # not a choice: one sentence score against the threshold
        "examples": [
            {"id": i, "answer": names[p], "score": float(v), "gold": names[y]}
            for i, (p, v, y) in enumerate(zip(pred, dev_scores, labels))
        ],
    }


def zs_race(
    scorer: Scorer, tok: TextEncoder, examples: list[ChoiceExample], calibrate: bool = False
) -> dict[str, Any]:
    contexts = [tok.encode(ex.context + " " + ex.question) for ex in examples]
    cands = [[tok.encode(o) for o in ex.choices] for ex in examples]
    scores = _candidate_scores(scorer, contexts, cands, "mean")
    if calibrate:
        cf = tok.encode(CONTENT_FREE)
        scores = scores - _candidate_scores(scorer, [cf] * len(cands), cands, "mean")
    labels = np.array([ex.label for ex in examples])
    rows = choice_rows(scores, [list(ex.choices) for ex in examples], labels)
    return {"accuracy": float((_pick(scores) == labels).mean()), "examples": rows}


def dpr_requests(tok: TextEncoder, ex: zd.DprExample, prefix_override: str | None = None):
    """Per candidate: (context = sentence up to and including the candidate, rest of sentence)."""
    at = zd.find_word(ex.sentence, ex.pronoun)
    before, after = ex.sentence[:at], ex.sentence[at + len(ex.pronoun) :]
    out = []
    for cand in ex.candidates:
        prefix = (before if prefix_override is None else prefix_override) + cand
        # Encoding the two halves separately keeps the scored tokens identical for both
        # candidates; GPT-1's BPE works word by word, so this equals encoding the whole sentence
        # except where spaCy would merge across the boundary.
        out.append((tok.encode(prefix), tok.encode(after)))
    return out


def zs_dpr(
    scorer: Scorer, tok: TextEncoder, examples: list[zd.DprExample], calibrate: bool = False
) -> dict[str, Any]:
    def mean_scores(override: str | None) -> np.ndarray:
        reqs = [r for ex in examples for r in dpr_requests(tok, ex, override)]
        return np.array([s.mean for s in scorer.score(reqs)]).reshape(len(examples), 2)

    scores = mean_scores(None)
    if calibrate:
        scores = scores - mean_scores(CONTENT_FREE + " ")
    labels = np.array([ex.answer for ex in examples])
    rows = choice_rows(scores, [list(ex.candidates) for ex in examples], labels)
    return {"accuracy": float((_pick(scores) == labels).mean()), "examples": rows}


def zs_story_cloze(
    scorer: Scorer, tok: TextEncoder, examples: list[ChoiceExample], calibrate: bool = False
) -> dict[str, Any]:
    contexts = [tok.encode(ex.context) for ex in examples]
    cands = [[tok.encode(e) for e in ex.choices] for ex in examples]
    scores = _candidate_scores(scorer, contexts, cands, "mean")
    if calibrate:
        scores = scores - _candidate_scores(
            scorer, [tok.encode(CONTENT_FREE)] * len(cands), cands, "mean"
        )
    labels = np.array([ex.label for ex in examples])
    rows = choice_rows(scores, [list(ex.choices) for ex in examples], labels)
    return {"accuracy": float((_pick(scores) == labels).mean()), "examples": rows}


def zs_lambada(
    scorer: Scorer, tok: TextEncoder, examples: list[tuple[str, str]], calibrate: bool = False
) -> dict[str, Any]:
    targets = [tok.encode(word) for _, word in examples]
    scored = scorer.score(
        [(tok.encode(ctx), t) for (ctx, _), t in zip(examples, targets)], greedy=True
    )
    # A target holding the unknown token cannot have been predicted: it counts as a miss (a
    # vocabulary without the word would otherwise "predict" <unk> <unk> perfectly).
    unk = getattr(tok, "unk_id", None)
    has_unk = [unk is not None and unk in t for t in targets]
    total = sum(len(s.logprobs) for s in scored)
    return {
        "accuracy": float(np.mean([s.greedy and not u for s, u in zip(scored, has_unk)])),
        "unknown_targets": int(sum(has_unk)),
        "word_perplexity": float(math.exp(-sum(s.total for s in scored) / len(scored))),
        "token_perplexity": float(math.exp(-sum(s.total for s in scored) / max(total, 1))),
        # not a choice: the target word's log-probability, and whether greedy decoding says it
        "examples": [
            {"id": i, "target": word, "correct": bool(s.greedy and not u), "score": s.total}
            for i, ((_, word), s, u) in enumerate(zip(examples, scored, has_unk))
        ],
    }


# ------------------------------------------------------------------------------- task table
@dataclass(frozen=True)
class ZeroShotTask:
    """One zero-shot task: its heuristic, its loader and where it lives under a data root."""

    name: str
    load: Callable[[Path, int | None], dict[str, Any]]  # folder, limit -> heuristic kwargs
    run: Callable[..., dict[str, Any]]  # the heuristic
    folders: tuple[str, ...]  # standard subfolders of a data root holding the task
    marker: str | None  # a file pattern that says "this folder is the task's own"


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
        return {
            "examples": _cut([(e.text, int(e.label)) for e in examples], limit),
            "file": str(path),
        }

    return load


def _load_cola(folder: Path, limit: int | None) -> dict[str, Any]:
    train, _ = _read_split("cola", folder, ["train"])
    dev, path = _read_split("cola", folder, ["dev"])
    return {
        "train": _cut([(e.text, int(e.label)) for e in train], limit),
        "dev": _cut([(e.text, int(e.label)) for e in dev], limit),
        "file": str(path),
    }


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


def _registered(
    name: str,
    load: Callable[[Path, int | None], dict[str, Any]],
    run: Callable[..., dict[str, Any]],
    marker: str | None,
) -> ZeroShotTask:
    """A zero-shot task the fine-tuning registry defines: its name and folders come from there."""
    task = get_task(name)  # an unknown name fails here, at import, not halfway through a sweep
    return ZeroShotTask(task.name, load, run, task.folders, marker)


# Splits: SST-2 and CoLA dev (CoLA's threshold from train), Story Cloze and RACE test (RACE dev
# when there is no test), DPR test.c.txt, the LAMBADA test passages.
TASKS: dict[str, ZeroShotTask] = {
    t.name: t
    for t in [
        _registered("sst2", _load_text("sst2", "dev"), zs_sst2, "dev.tsv"),
        _registered("cola", _load_cola, zs_cola, "train.tsv"),
        _registered("race", _load_choice("race", ["test", "dev"]), zs_race, None),
        ZeroShotTask(
            "dpr", _file_loader(["test.c.txt"], zd.read_dpr), zs_dpr, ("dpr", "DPR"), "test.c.txt"
        ),
        _registered("story_cloze", _load_choice("story_cloze", ["test"]), zs_story_cloze, "*.csv"),
        ZeroShotTask(
            "lambada",
            _file_loader(["*.txt"], zd.read_lambada),
            zs_lambada,
            ("corpus/lambada", "lambada"),
            "*.txt",
        ),
    ]
}


def task_folder(task: str, data: Path) -> Path | None:
    """`data` itself when it holds the task's files, else its standard subfolder, else None."""
    data = Path(data)
    spec = TASKS[task]
    if task == "race":
        if any(data.glob("*.jsonl")) or (data / "test").is_dir() or (data / "dev").is_dir():
            return data
    elif any(data.glob(spec.marker)):
        return data
    for sub in spec.folders:
        if (data / sub).is_dir():
            return data / sub
    return None


def parse_tasks(spec: str) -> list[str]:
    names = list(TASKS) if spec == "all" else [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ConfigError(
            f"unknown task(s) {', '.join(unknown) or spec!r}; choose from "
            f"{', '.join(TASKS)} or 'all'"
        )
    return names


def run_task(
    task: str,
    scorer: Scorer,
    tok: TextEncoder,
    folder: Path,
    limit: int | None = None,
    calibrate: bool = False,
) -> dict[str, Any]:
    """Read the task's data from `folder`, apply its heuristic, add n / normalised score."""
    kwargs = TASKS[task].load(Path(folder), limit)
    file = kwargs.pop("file")
    n = len(kwargs.get("examples", kwargs.get("dev", [])))
    if n == 0:
        raise DataError(f"no {task} examples", file)
    start, scorer.truncated = time.perf_counter(), 0
    result = TASKS[task].run(scorer, tok, calibrate=calibrate, **kwargs)
    ref = REFERENCES[task]
    result.update(
        {
            "task": task,
            "metric": ref.metric,
            "value": result[ref.metric],
            "normalised": normalised(task, result[ref.metric]),
            "n": n,
            "chance": ref.chance,
            "reference": ref.sota,
            "reference_source": ref.source,
            "calibrated": calibrate and task not in ("cola", "lambada"),
            "file": file,
            "truncated": scorer.truncated,
            "context": scorer.n_positions,
            "seconds": time.perf_counter() - start,
        }
    )
    return result
