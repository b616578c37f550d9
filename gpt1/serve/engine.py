"""What the server computes, as plain functions of one loaded model (no HTTP here).

`load_engine(path)` loads a fine-tuned run (any task kind, including user csv/tsv/jsonl tasks)
or a pretrained checkpoint (GPT or the LSTM baseline). An `Engine` then
- turns request items into task examples and model inputs with the library's own readers'
  example types and transformations (`gpt1.tasks.batches.encode_split`), and predicts them with
  `gpt1.recipes.evaluate.predict_raw`, the function behind `gpt1 predict`;
- scores continuations with the zero-shot `Scorer` (`gpt1.zeroshot.scorer`);
- generates with `gpt1.inference.batched.BatchedDecoder` (continuous batching: concurrent
  generations share forward passes), which chooses tokens as `gpt1 sample` does.
All of these run on the unpadded path (`GPT.forward(ids, lengths=...)`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gpt1.errors import CheckpointError, ConfigError, DataError
from gpt1.inference.sampling import Sampling
from gpt1.tasks.batches import Encoded, encode_split
from gpt1.tasks.examples import ChoiceExample, Example, PairExample, Split, TextExample
from gpt1.tasks.registry import Task
from gpt1.tasks.rows import EMPTY_TEXT, has_visible_text

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "int8")
# Request field names of the built-in tasks, by kind (user tasks use their own column names).
KIND_FIELDS = {
    "single": {"text": "text"},
    "pair": {"premise": "a", "hypothesis": "b"},
    "similarity": {"sentence1": "a", "sentence2": "b"},
    "choice": {"context": "context", "question": "question", "choices": "choices"},
}


@dataclass
class Prediction:
    """One example's prediction: what `gpt1 predict` writes (`label`), and the numbers behind it."""

    label: str  # as in gpt1 predict's submission file
    score: float | None  # regression tasks (STS-B): the predicted score
    probabilities: list[float] | None  # per class, or per choice; None for regression

    def as_dict(self, labels: list[str] | None) -> dict[str, Any]:
        if self.probabilities is None:
            return {"label": self.label, "score": self.score}
        probs: Any = (
            dict(zip(labels, self.probabilities)) if labels is not None else self.probabilities
        )
        return {"label": self.label, "probabilities": probs}


class Engine:
    """One loaded model: a fine-tuned classifier (with its task) or a language model."""

    def __init__(
        self,
        folder: Path,
        lm: torch.nn.Module,
        tokenizer: Any | None,
        classifier: torch.nn.Module | None = None,
        task: Task | None = None,
        record: dict | None = None,
        precision: str = "fp32",
    ):
        from gpt1.inference.batched import BatchedDecoder
        from gpt1.model.checkpoint import trained_context
        from gpt1.zeroshot.scorer import Scorer

        self.folder, self.lm, self.tokenizer = folder, lm, tokenizer
        self.classifier, self.task, self.record = classifier, task, record or {}
        self.precision = precision
        self.scorer = Scorer(lm, max_context=trained_context(folder))
        self.n_positions = lm.config.n_positions
        # Generations, decoded together (continuous batching) by the batcher's worker thread.
        self.decoder = BatchedDecoder(lm)

    # ------------------------------------------------------------------ description
    @property
    def kind(self) -> str:
        return "classifier" if self.task is not None else "language-model"

    @property
    def fields(self) -> dict[str, str]:
        """Request field -> example role (text, a, b, context, question, choices)."""
        if self.task is None:
            return {}
        columns = self.task.spec.get("columns")
        if columns:  # a user task: its own column names
            roles = [
                r for r in ("text", "a", "b", "context", "question", "choices") if r in columns
            ]
            return {columns[r]: r for r in roles}
        return dict(KIND_FIELDS[self.task.kind])

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model": model_name(self.folder),
            "checkpoint": self.folder.name,
            "kind": self.kind,
            "precision": self.precision,
            "n_positions": self.n_positions,
            "tokenizer": self.tokenizer is not None,
        }
        if self.task is not None:
            info.update(
                task=self.task.name,
                task_kind=self.task.kind,
                labels=self.task.labels,
                fields=list(self.fields),
            )
        return info

    # --------------------------------------------------------------------- predict
    def examples(self, items: list[dict[str, Any]]) -> list[Example]:
        """Request items (validated field -> value dicts) -> the task's example objects."""
        if self.task is None:
            raise ConfigError(
                "this model is a pretrained language model; /v1/predict needs a fine-tuned run"
            )
        roles = self.fields
        out: list[Example] = []
        for n, item in enumerate(items):
            by_role = {roles[k]: v for k, v in item.items() if v is not None}
            for role, value in by_role.items():
                values = value if isinstance(value, list) else [value]
                if role != "question" and not all(map(has_visible_text, values)):
                    field = next(k for k, r in roles.items() if r == role)
                    raise DataError(f"inputs[{n}].{field}: {EMPTY_TEXT}")
            kind = self.task.kind
            if kind == "single":
                out.append(TextExample(by_role["text"], uid=str(n)))
            elif kind in ("pair", "similarity"):
                out.append(PairExample(by_role["a"], by_role["b"], uid=str(n)))
            else:
                out.append(
                    ChoiceExample(
                        by_role["context"],
                        by_role.get("question", ""),
                        list(by_role["choices"]),
                        uid=str(n),
                    )
                )
        return out

    def encode(self, examples: list[Example]) -> list[list[list[int]]]:
        """Examples -> their K id sequences each, exactly as `gpt1 predict` builds them."""
        split = Split("request", Path("<request>"), examples)
        enc = encode_split(
            split,
            self.task,
            self.tokenizer,
            self.record["n_ctx"],
            self.record.get("question_delimiter", False),
        )
        return enc.items

    def predict(self, items: list[list[list[int]]], micro: int = 64) -> list[Prediction]:
        """Predictions of encoded examples (one forward per `micro` examples, longest first)."""
        from gpt1.recipes.evaluate import label_text, predict_raw

        raw = predict_raw(
            self.classifier,
            self.task,
            Encoded(items, [None] * len(items), [""] * len(items)),
            micro,
        )
        out = []
        for row in raw:
            if self.task.regression:
                out.append(Prediction(label_text(self.task, row), float(row), None))
                continue
            logits = torch.tensor(row)  # float32, as predict_outputs' argmax sees them
            best = int(logits.argmax())
            probs = logits.double().softmax(-1).tolist()
            out.append(Prediction(label_text(self.task, best), None, probs))
        return out

    # ----------------------------------------------------------------------- score
    def token_ids(self, text: str | None, ids: list[int] | None, what: str) -> list[int]:
        """A text (encoded with the model's tokenizer) or ids (checked against the vocabulary)."""
        if ids is not None:
            vocab = self.lm.config.vocab_size
            bad = [i for i in ids if not 0 <= i < vocab]
            if bad:
                raise DataError(f"{what}_ids: {bad[0]} is outside the vocabulary (0..{vocab - 1})")
            return list(ids)
        if self.tokenizer is None:
            raise CheckpointError(
                f"{self.folder.name}: no tokenizer files, so a text {what} "
                f"cannot be encoded; send {what}_ids"
            )
        return list(self.tokenizer.encode(text or ""))

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[dict[str, Any]]:
        """Per (context ids, continuation ids): token log-probabilities, total, mean, greedy,
        and how many context tokens the model saw (a context longer than the window left after
        the continuation loses its first tokens; a continuation must fit whole: the app checks)."""
        scores = self.scorer.score(pairs, greedy=True)
        window = self.scorer.n_positions
        return [
            {
                "logprobs": s.logprobs,
                "total": s.total,
                "mean": s.mean if s.logprobs else None,
                "greedy": s.greedy,
                "tokens": len(s.logprobs),
                "context_tokens": min(len(ctx), window - len(cont) + 1),
            }
            for s, (ctx, cont) in zip(scores, pairs)
        ]

    # ------------------------------------------------- every position (OpenAI logprobs)
    @property
    def window(self) -> int:
        """The most tokens a scored sequence may hold (the scorer's window: the positions the
        model has, or fewer when it was pretrained on a shorter context)."""
        return self.scorer.n_positions

    def sequence_logprobs(self, items: list[SequenceScoring]) -> list[SequenceLogprobs]:
        """Each sequence's tokens scored at every position, with alternatives: one `Scorer`
        call for the whole batch (rows sorted, packed and prefix-shared as for /v1/score)."""
        for it in items:
            rows = len(it.ids) - (0 if it.next_token else 1)
            if not it.ids or rows > self.window:
                raise DataError(f"{len(it.ids)} tokens do not fit the {self.window}-token window")
        k = max(max(it.top, 1 if it.next_token else 0) for it in items)
        # After the last token, the position is scored for a stand-in target (its own id):
        # only its alternatives are kept.
        requests = [(it.ids[:1], it.ids[1:] + it.ids[-1:] * it.next_token) for it in items]
        out = []
        for it, score in zip(items, self.scorer.score(requests, top=k)):
            n = len(it.ids) - 1
            tops = score.top or [[] for _ in range(n)]
            out.append(
                SequenceLogprobs(
                    score.logprobs[:n],
                    [alts[: it.top] for alts in tops[:n]],
                    tops[n][: max(it.top, 1)] if it.next_token else None,
                )
            )
        return out

    # -------------------------------------------------------------------- generate
    def generation(self, prompt_ids: list[int], sampling: Sampling) -> GenerationRequest:
        """A generation for `self.decoder`, drawing tokens as `gpt1 sample` does with `sampling`."""
        s = sampling
        generator = s.generator(self.decoder.device)
        return GenerationRequest(
            prompt_ids, s.max_new_tokens, s.temperature, s.top_k, s.top_p, generator
        )

    def decode(self, ids: list[int]) -> str | None:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else None


def model_name(folder: Path) -> str:
    """What /health calls the model: `run/checkpoint` for a run's checkpoint (`sst2/final`),
    the folder's name for a checkpoint folder of its own."""
    name = folder.name
    if name in ("final", "best") or (name.startswith("step-") and name[5:].isdigit()):
        return f"{folder.parent.name}/{name}"
    return name


@dataclass
class SequenceScoring:
    """A sequence to score at every position (OpenAI's `echo` and `logprobs`)."""

    ids: list[int]
    top: int = 0  # alternatives per position
    next_token: bool = False  # also the distribution after the last token


@dataclass
class SequenceLogprobs:
    """`logprobs[i]`: token i+1's log-probability given the tokens before it; `top[i]`: the
    likeliest tokens at that position as (id, log-probability); `next`: the likeliest tokens
    after the last one (when asked for)."""

    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    next: list[tuple[int, float]] | None


class GenerationRequest(NamedTuple):
    """A generation: `BatchedDecoder.start`'s arguments, in its order (the batcher's worker
    thread starts it with them: `decoder.start(*request)`)."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    generator: torch.Generator


def load_engine(path: str | Path, device: str = "auto", precision: str = "auto") -> Engine:
    """Load a fine-tuned run or a pretrained checkpoint (folder or run folder) for serving;
    `auto` device and precision as every command resolves them (`gpt1.devices`)."""
    from gpt1.devices import resolve_device, resolve_precision
    from gpt1.inference.loading import load_for_inference

    device = resolve_device(device)
    precision = resolve_precision(precision, device, ("auto", *PRECISIONS))
    loaded = load_for_inference(path, device, precision)
    classifier = loaded.model if loaded.task is not None else None
    return Engine(
        loaded.checkpoint.folder,
        loaded.lm,
        loaded.tokenizer,
        classifier,
        loaded.task,
        loaded.record,
        precision,
    )
