"""gpt1 checkpoints as a native model of EleutherAI's lm-evaluation-harness (`lm-eval`).

`Gpt1LM` implements the harness's three request types with gpt1's own machinery:

* `loglikelihood`: `gpt1.inference.scoring.Scorer` (length-sorted, right-padded rows whose padding the model
  skips; rows that are prefixes of others share a forward pass; the output layer only at the
  scored positions) on the faithful GPT-1 tokenizer (ftfy, spaCy, lowercase, BPE with `</w>`).
  Context/continuation splitting is the harness's own (`TemplateLM._encode_pair`), so the token
  ids equal those of the harness's `hf` model with the slow transformers tokenizer.
* `loglikelihood_rolling`: the harness's own rolling windows (`get_rolling_token_windows`,
  context length 1), all windows of all documents scored in one `Scorer.score` call.
* `generate_until`: greedy (or sampled, when a task asks for it) decoding with the key/value
  cache of `gpt1.inference.generate.generate_stream`, stopped as soon as a stop string appears in the text.

GPT-1 has no start-of-text token. Where the harness needs a token before the text (an empty
context, the first rolling window) the adapter uses `prefix_token_id`: by default the token
`gpt1 convert --to hf` declares as the export's start token, so both routes score alike: `<unk>`
("no text"; gpt1 pads with it) for a pretrained LM, `_start_` for a fine-tuned model's body (every
fine-tuning input starts with it). `prefix_token_id=N` chooses another. The context is capped at the window the checkpoint was pretrained on
(`run.json`), else at `n_positions`; `max_length=N` caps it further.

Register with `register()` (done by `gpt1 lm-eval` and `gpt1.recipes.harness.simple_evaluate`);
the task definitions for data the harness cannot fetch offline live in `gpt1/lm_eval_tasks/`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from gpt1.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

MODEL_NAME = "gpt1"


def register() -> None:
    """Make `--model gpt1` known to the harness (idempotent)."""
    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME)(Gpt1LM)


def _harness_device(name: str | None) -> torch.device:
    """The harness passes `cuda:0` by default; fall back to auto when there is no GPU."""
    from gpt1.devices import resolve_device

    if name and name.startswith("cuda") and not torch.cuda.is_available():
        log.info("lm-eval: no CUDA device; running on the CPU")
        name = "auto"
    return resolve_device(name or "auto")


MISSING_CHECKPOINT = (
    "--model_args checkpoint=DIR is required: a gpt1 checkpoint or run folder "
    "(e.g. --model_args checkpoint=runs/mini --tasks gpt1_lambada)"
)


def model_arg_int(name: str, value: Any, least: int = 1, most: int | None = None) -> int:
    """The integer model argument `name`, refused in one line unless it lies in least..most."""
    number = None
    if isinstance(value, float) and value.is_integer():  # the harness reads "-5" as -5.0
        number = int(value)
    elif not isinstance(value, bool):
        with contextlib.suppress(TypeError, ValueError):
            number = int(str(value).strip())
    if number is None or number < least or (most is not None and number > most):
        bound = f"{least}..{most}" if most is not None else f">= {least}"
        why = " (the checkpoint's window)" if name == "max_length" else ""
        raise ConfigError(f"--model_args {name} must be an integer {bound}{why}, got {value!r}")
    return number


# Model arguments besides checkpoint, tokenizer, device and precision, and their defaults.
MODEL_ARGS = dict(
    batch_tokens=4096, max_rows=64, max_length=None, max_gen_toks=256, prefix_token_id=None
)
# Read and dropped: rows per forward pass follow a token budget (batch_tokens, max_rows), not the
# harness's batch sizes; `model` is only the run's name, which the harness reads itself.
DROPPED_ARGS = {"model", "batch_size", "max_batch_size"}


class Gpt1LM(TemplateLM):
    """A gpt1 checkpoint (GPT or the LSTM baseline) for the evaluation harness (module doc);
    `model_args` are those of `MODEL_ARGS`, the others are ignored with a warning."""

    def __init__(
        self,
        checkpoint: str | None = None,
        tokenizer: str | None = None,
        device: str | None = "auto",
        precision: str = "auto",
        **model_args: Any,
    ) -> None:
        super().__init__()
        from gpt1.checkpoint_files import open_checkpoint
        from gpt1.inference.loading import load_for_inference
        from gpt1.inference.scoring import Scorer

        unused = set(model_args) - set(MODEL_ARGS) - DROPPED_ARGS
        if unused:
            log.warning("lm-eval: gpt1 ignores model_args %s", ", ".join(sorted(unused)))
        args = {**MODEL_ARGS, **model_args}
        if not checkpoint:
            raise ConfigError(MISSING_CHECKPOINT)
        batch_tokens = model_arg_int("batch_tokens", args["batch_tokens"])
        max_rows = model_arg_int("max_rows", args["max_rows"])
        self.max_gen_toks = model_arg_int("max_gen_toks", args["max_gen_toks"])
        opened = open_checkpoint(checkpoint)
        if not tokenizer and opened.tokenizer_dir is None:
            raise CheckpointError(
                f"{opened.folder}: no tokenizer files (vocab.json + merges.txt); "
                "pass tokenizer=DIR in --model_args"
            )
        loaded = load_for_inference(opened, _harness_device(device), precision, tokenizer)
        self.tok, self._device, self.precision = loaded.tokenizer, loaded.device, loaded.precision
        model, window = loaded.lm, loaded.window
        self.max_length = window
        if args["max_length"] is not None:
            self.max_length = model_arg_int("max_length", args["max_length"], most=window)
        self.scorer = Scorer(
            model, batch_tokens=batch_tokens, max_rows=max_rows, max_context=self.max_length
        )
        self.model = model
        prefix_token_id = args["prefix_token_id"]
        if prefix_token_id is None:  # as the transformers export declares (module doc)
            fine_tuned = model.config.vocab_size > self.tok.vocab_size  # task tokens appended
            prefix_token_id = self.tok.vocab_size if fine_tuned else self.tok.unk_id
        self._prefix = model_arg_int(
            "prefix_token_id", prefix_token_id, 0, model.config.vocab_size - 1
        )
        self.checkpoint = str(opened.folder)

    # -- what the harness reads (also the attributes max_length and max_gen_toks) --------------
    @property
    def eot_token_id(self) -> int:
        # GPT-1 has no end-of-text token; the prefix token stands in where the harness needs one
        # (`TemplateLM.prefix_token_id` is this one too).
        return self._prefix

    @property
    def tokenizer_name(self) -> str:
        return f"gpt1:{self.checkpoint}"

    def get_model_info(self) -> dict[str, Any]:
        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": self.precision,
            "model_revision": "",
            "model_sha": "",
        }

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        """GPT-1's ids for `string` (GPT-1 adds no special tokens, so the flag changes nothing)."""
        return list(self.tok.encode(string))

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)

    # -- scoring -------------------------------------------------------------------------------
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        scores = self.scorer.score([(ctx, cont) for _, ctx, cont in requests], greedy=True)
        out = []
        for (key, _, _), score in zip(requests, scores):
            result = (score.total, bool(score.greedy))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Sum of every token's log-probability, in the harness's disjoint rolling windows."""
        windows: list[tuple[list[int], list[int]]] = []
        counts: list[int] = []
        for (string,) in (req.args for req in requests):
            doc = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self._prefix,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            windows.extend(doc)
            counts.append(len(doc))
        scores = iter(self.scorer.score(windows))
        out = []
        for req, n in zip(requests, counts):
            total = sum(next(scores).total for _ in range(n))
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
            out.append(total)
        return out

    # -- generation ----------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Continue each context until a stop string (`until`) or `max_gen_toks` tokens."""
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            text = self.generate_text(context, dict(gen_kwargs or {}))
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        return out

    def generate_text(self, context: str, gen_kwargs: dict[str, Any]) -> str:
        """One continuation of `context` as a task's generation arguments ask (`until`,
        `max_gen_toks`, `do_sample`, `temperature`, `top_k`, `top_p`, `seed`; others are
        ignored), cut before the first stop string in `until`."""
        from gpt1.inference.generate import TextStream, generate_stream
        from gpt1.inference.sampling import Sampling

        until, n_new = gen_kwargs.get("until"), gen_kwargs.get("max_gen_toks")
        stops = [until] if isinstance(until, str) else list(until or [])
        n_new = self.max_gen_toks if n_new is None else int(n_new)
        temperature, seed = gen_kwargs.get("temperature", 0.0), gen_kwargs.get("seed")
        if not gen_kwargs.get("do_sample", False):
            temperature = 0.0
        elif temperature == 0:
            temperature = 1.0
        ids = self.tok_encode(context) or [self._prefix]
        # Keep room for the new tokens inside the window, like the harness's own models.
        ids = ids[-max(1, self.max_length - n_new) :]
        seed = seed if seed is not None else 1234  # a sampled task draws reproducibly
        top_k, top_p = gen_kwargs.get("top_k"), gen_kwargs.get("top_p")
        sampling = Sampling(
            max_new_tokens=n_new, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
        )
        stream = TextStream(self.tok)
        text = ""
        for token in generate_stream(self.model, torch.tensor([ids]), sampling):  # [1, 1] a step
            text += stream.push(int(token[0, 0]))
            cut = _first_stop(text, stops)
            if cut is not None:
                return text[:cut]
        text += stream.flush()
        cut = _first_stop(text, stops)
        return text if cut is None else text[:cut]


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Index of the earliest stop string in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
