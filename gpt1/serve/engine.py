"""What the server computes, as plain functions of one loaded model (no HTTP here).

`load_engine(path)` loads a fine-tuned run (any task kind, including user csv/tsv/jsonl tasks)
or a pretrained checkpoint (GPT or the LSTM baseline) as an `Engine`, made of two parts:
- its `LanguageEngine` (every served model has one; a fine-tuned run's is its GPT) turns texts
  into ids, scores continuations and whole sequences with the zero-shot `Scorer`
  (`gpt1.inference.scoring`), and generates with `gpt1.inference.batched.BatchedDecoder`
  (continuous batching: concurrent generations share forward passes), which chooses tokens as
  `gpt1 sample` does;
- for a fine-tuned run, its `ClassifierEngine` (`engine.classifier`) turns request items into
  task examples and model inputs with the library's own readers' example types and
  transformations (`gpt1.tasks.batches.encode_split`), and predicts them with
  `gpt1.inference.prediction.predict_raw`, the function behind `gpt1 predict`.
All of these run on the unpadded path (`GPT.forward(ids, lengths=...)`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gpt1.errors import CheckpointError, ConfigError, DataError
from gpt1.inference.batched import BatchedDecoder, Event, Generation
from gpt1.inference.prediction import label_text, predict_raw
from gpt1.inference.sampling import Sampling
from gpt1.inference.speculative import Drafts
from gpt1.tasks.batches import Encoded, encode_split
from gpt1.tasks.examples import Example, Split
from gpt1.tasks.kinds import INPUT_ROLES, KINDS, example
from gpt1.tasks.registry import Task
from gpt1.tasks.rows import EMPTY_TEXT, has_visible_text

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """One example's prediction: what `gpt1 predict` writes (`label`), and the numbers behind it."""

    label: str  # as in gpt1 predict's submission file
    score: float | None  # regression tasks (STS-B): the predicted score
    probabilities: list[float] | None  # per class, or per choice; None for regression
    label_name: str | None = None  # what the class means (SST-2's "1": "positive"); classes only

    def as_dict(self, labels: list[str] | None) -> dict[str, Any]:
        if self.probabilities is None:
            return {"label": self.label, "score": self.score}
        probs: Any = (
            dict(zip(labels, self.probabilities)) if labels is not None else self.probabilities
        )
        name = {} if self.label_name is None else {"label_name": self.label_name}
        return {"label": self.label, **name, "probabilities": probs}


class LanguageEngine:
    """The served model's language model (a fine-tuned run's too): token ids of a request,
    scores of continuations and of whole sequences, generations."""

    def __init__(
        self, folder: Path, lm: torch.nn.Module, tokenizer: Any | None, window: int | None = None
    ):
        """`window`: the positions scoring reads at most (default: the trained window that
        `folder`'s run.json records, else the model's)."""
        from gpt1.checkpoint_files import trained_context
        from gpt1.inference.scoring import Scorer

        self.folder, self.lm, self.tokenizer = folder, lm, tokenizer
        window = window if window is not None else trained_context(folder)
        self.scorer = Scorer(lm, max_context=window)
        self.n_positions = lm.config.n_positions
        # Generations, decoded together (continuous batching) by the batcher's worker thread,
        # inside the same window as scoring.
        # Sampling draws only ids the tokenizer can decode (a table may have more rows).
        vocab = len(tokenizer) if tokenizer is not None else None
        self.decoder = BatchedDecoder(lm, self.window, vocab)

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
        if not has_visible_text(text or ""):  # one rule for every text the model reads
            raise DataError(f"{what}: {EMPTY_TEXT}")
        return list(self.tokenizer.encode(text or ""))

    def decode(self, ids: list[int]) -> str | None:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else None

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

    @property
    def window(self) -> int:
        """The most tokens a scored sequence may hold (the scorer's window: the positions the
        model has, or fewer when it was pretrained on a shorter context)."""
        return self.scorer.n_positions

    def sequence_logprobs(self, items: list[SequenceScoring]) -> list[SequenceLogprobs]:
        """Each sequence's tokens scored at every position, with alternatives (OpenAI's
        logprobs): one `Scorer` call for the whole batch (rows sorted, packed and
        prefix-shared as for /v1/score)."""
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

    # Generations: a handler makes the request (`generation`) on the event loop; the batcher's
    # worker thread runs it with this engine as its `Generations` (start, step, stop: the decoder).
    def generation(self, prompt_ids: list[int], sampling: Sampling) -> GenerationRequest:
        """A generation drawing tokens as `gpt1 sample` does with `sampling` (`start`'s args)."""
        return GenerationRequest(prompt_ids, sampling, sampling.generator(self.decoder.device))

    def start(
        self, prompt_ids: list[int], sampling: Sampling, generator: torch.Generator
    ) -> Generation:
        return self.decoder.add(prompt_ids, sampling, generator)

    def step(self) -> list[Event]:
        return self.decoder.step()

    @property
    def drafts(self) -> Drafts:
        """The tokens a lone generation drafted and had accepted so far (`/metrics`)."""
        return self.decoder.drafts

    def stop(self, generation: Generation) -> None:
        self.decoder.stop(generation)


class ClassifierEngine:
    """A fine-tuned run's task model: request items -> the task's examples -> their input
    sequences -> predictions, as `gpt1 predict` makes them."""

    def __init__(self, model: torch.nn.Module, task: Task, record: dict, tokenizer: Any):
        self.model, self.task, self.record, self.tokenizer = model, task, record, tokenizer

    @property
    def fields(self) -> dict[str, str]:
        """Request field -> example role (text, a, b, context, question, choices)."""
        columns = self.task.spec.get("columns")
        if columns:  # a user task: its own column names
            return {columns[r]: r for r in INPUT_ROLES if r in columns}
        return dict(KINDS[self.task.kind].fields)

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "task_kind": self.task.kind,
            "labels": self.task.labels,
            "fields": list(self.fields),
        }

    def examples(self, items: list[dict[str, Any]], one: bool = False) -> list[Example]:
        """Request items (validated field -> value dicts) -> the task's example objects
        (`one`: the request sent one object as `inputs`, not a list, so errors say
        `inputs.text`, not `inputs.0.text`)."""
        roles = self.fields
        out: list[Example] = []
        for n, item in enumerate(items):
            by_role = {roles[k]: v for k, v in item.items() if v is not None}
            for role, value in by_role.items():
                values = value if isinstance(value, list) else [value]
                if role != "question" and not all(map(has_visible_text, values)):
                    field = next(k for k, r in roles.items() if r == role)
                    where = f"inputs.{field}" if one else f"inputs.{n}.{field}"  # as sent
                    raise DataError(f"{where}: {EMPTY_TEXT}")
            out.append(example(self.task.kind, by_role, uid=str(n)))
        return out

    def encode(self, examples: list[Example]) -> list[list[list[int]]]:
        """Examples -> their K id sequences each, exactly as `gpt1 predict` builds them."""
        split = Split("request", Path("<request>"), examples)
        n_ctx, delimiter = self.record["n_ctx"], self.record.get("question_delimiter", False)
        return encode_split(split, self.task, self.tokenizer, n_ctx, delimiter).items

    def predict(self, items: list[list[list[int]]], micro: int = 64) -> list[Prediction]:
        """Predictions of encoded examples (one forward per `micro` examples, longest first)."""
        blank = Encoded(items, [None] * len(items), [""] * len(items))
        out = []
        for row in predict_raw(self.model, self.task, blank, micro):
            if self.task.regression:
                out.append(Prediction(label_text(self.task, row), float(row), None))
                continue
            logits = torch.tensor(row)  # float32, as predict_outputs' argmax sees them
            best = int(logits.argmax())
            probs = logits.double().softmax(-1).tolist()
            name = self.task.label_name(best) if not self.task.is_choice else None
            out.append(Prediction(label_text(self.task, best), None, probs, name))
        return out


class Engine(LanguageEngine):
    """One loaded model: its language model (`LanguageEngine`) and, for a fine-tuned run, its
    classifier (`ClassifierEngine`; None for a pretrained model, which has no task)."""

    def __init__(
        self,
        folder: Path,
        lm: torch.nn.Module,
        tokenizer: Any | None,
        classifier: ClassifierEngine | None = None,
        precision: str = "fp32",
        window: int | None = None,
    ):
        super().__init__(folder, lm, tokenizer, window)
        self.classifier, self.precision = classifier, precision

    @property
    def kind(self) -> str:
        return "classifier" if self.classifier is not None else "language-model"

    @property
    def task(self) -> Task | None:
        return self.classifier.task if self.classifier is not None else None

    @property
    def fields(self) -> dict[str, str]:
        """The predict request's fields and their roles ({} for a language model)."""
        return self.classifier.fields if self.classifier is not None else {}

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model": model_name(self.folder),
            "checkpoint": self.folder.name,
            "kind": self.kind,
            "precision": self.precision,
            "n_positions": self.n_positions,
            "window": self.window,
            "tokenizer": self.tokenizer is not None,
        }
        return info | (self.classifier.describe() if self.classifier is not None else {})

    def examples(self, items: list[dict[str, Any]], one: bool = False) -> list[Example]:
        return self._classifier().examples(items, one)

    def encode(self, examples: list[Example]) -> list[list[list[int]]]:
        return self._classifier().encode(examples)

    def predict(self, items: list[list[list[int]]], micro: int = 64) -> list[Prediction]:
        return self._classifier().predict(items, micro)

    def _classifier(self) -> ClassifierEngine:
        if self.classifier is None:
            raise ConfigError(
                "this model is a pretrained language model; /v1/predict needs a fine-tuned run"
            )
        return self.classifier


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
    """A generation: `LanguageEngine.start`'s arguments, in its order (the batcher's worker
    thread starts it with them: `engine.start(*request)`)."""

    prompt_ids: list[int]
    sampling: Sampling
    generator: torch.Generator


def load_engine(path: str | Path, device: str = "auto", precision: str = "auto") -> Engine:
    """Load a fine-tuned run or a pretrained checkpoint (folder or run folder) for serving;
    `auto` device and precision as every command resolves them (`gpt1.devices`)."""
    from gpt1.devices import SERVE_PRECISIONS, resolve_device, resolve_precision
    from gpt1.inference.loading import load_for_inference

    device = resolve_device(device)
    precision = resolve_precision(precision, device, SERVE_PRECISIONS)
    loaded = load_for_inference(path, device, precision)
    task_model = None
    if loaded.task is not None:
        task_model = ClassifierEngine(loaded.model, loaded.task, loaded.record, loaded.tokenizer)
    return Engine(
        loaded.checkpoint.folder,
        loaded.lm,
        loaded.tokenizer,
        task_model,
        precision,
        window=loaded.window,
    )
