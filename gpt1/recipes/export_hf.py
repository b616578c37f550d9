"""What a transformers export holds besides the weights: tokenizer, trained window, task head, card.

`plan(...)` looks at the source (a pretrained LM or a fine-tuned checkpoint, the window it was
trained on, its vocabulary) and decides the export; `HFExport.adjust` maps weights and config,
`HFExport.write` adds the files. `convert --to hf` calls both and prints `HFExport.notes`.

- Tokenizer: `tokenizer.json` (gpt1's pipeline in `tokenizers`, see `gpt1.text.hf_tokenizer`) beside
  `vocab.json` + `merges.txt`; `tokenizer_config.json` names the slow `OpenAIGPTTokenizer` (exact
  with ftfy + spaCy), the trained window as `model_max_length`, and a start token for tools that
  need one (lm-evaluation-harness scores a text's first token after it): `_start_` for a
  fine-tuned model (every fine-tuning input starts with it), `<unk>` for a pretrained LM (GPT-1
  has no start-of-text token; `<unk>` stands for no text, and gpt1 pads with it).
- Positions: `n_positions` is the checkpoint's position table, as gpt1 itself, `gpt1 serve` and
  the ONNX export accept; a model trained on shorter windows says so in `model_max_length`, the
  notes and the card (rows past the window were never trained).
- Task head: a multiple-choice head (and a one-output head on one sequence) is exactly
  `OpenAIGPTDoubleHeadsModel`'s `multiple_choice_head` (linear layer with bias on the state at
  `mc_token_ids`, i.e. the `_classify_` token). No transformers class has the other heads'
  maths (`OpenAIGPTForSequenceClassification` has no bias and no sum over a similarity pair's
  two orders): those export the LM and the head beside it, and the notes and the card warn that
  `AutoModelForSequenceClassification` would load a random head. Every fine-tuned export also
  writes the head as `task_head.safetensors` + `task_head.json`; `config.json` names the classes
  (`id2label`, `label2id`), and the card's loading code (`gpt1.recipes.hf_snippet`) gives
  `gpt1 predict`'s probabilities.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gpt1 import files
from gpt1.checkpoint_files import open_checkpoint, resolve_checkpoint_dir, trained_context
from gpt1.model.checkpoint import model_config
from gpt1.model.finetuned import read_task_head
from gpt1.tasks.kinds import KINDS

HEAD_FILE, HEAD_INFO = "task_head.safetensors", "task_head.json"
RANDOM_HEAD_WARNING = (
    "WARNING: AutoModelForSequenceClassification.from_pretrained(DIR) would load a RANDOM, "
    "untrained classification head (transformers only logs a warning): load the trained head "
    "with the code in DIR/README.md (section 'Loading the classifier')"
)
TASK_TOKENS = ("_start_", "_delimiter_", "_classify_")
# Share of distinct lines of the shared test text whose ids differ from gpt1's, with the default
# fast tokenizer (benchmarks/hf_tokenizer_parity.py; docs/results.md).
FAST_MISMATCH = "0.001%"


@dataclass
class HFExport:
    """The decisions of one export; `notes` are printed by `convert` and repeated in the card."""

    trained: int | None = None  # the window the model was trained on, when recorded
    path: str = "DIR"  # the folder as the user named it, for the card's loading code
    record: dict | None = None  # task.json of a fine-tuned checkpoint
    head: dict[str, torch.Tensor] | None = None
    double_heads: bool = False  # head mapped onto OpenAIGPTDoubleHeadsModel
    vocab: tuple[dict, list] | None = None
    specials: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    # -------------------------------------------------------------- weights and config
    def adjust(
        self, state: dict[str, torch.Tensor], config: dict[str, Any]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The HF state dict and config.json with the mapped head and the class names."""
        if self.double_heads:
            assert self.head is not None
            config["architectures"] = ["OpenAIGPTDoubleHeadsModel"]
            config.update(
                summary_type="cls_index",
                summary_use_proj=True,
                summary_activation=None,
                summary_proj_to_labels=True,
                num_labels=1,
                summary_first_dropout=float(self.record.get("clf_pdrop", 0.1)),
            )
            state["multiple_choice_head.summary.weight"] = self.head["linear.weight"]
            state["multiple_choice_head.summary.bias"] = self.head["linear.bias"]
        if self.record is not None:
            config["gpt1_task"] = {
                k: self.record.get(k)
                for k in ("task", "kind", "labels", "n_outputs", "classify_id", "n_ctx")
            }
            labels = self.record.get("labels")
            if labels and not KINDS[self.record["kind"]].choice and not self.double_heads:
                config["id2label"] = {str(i): str(name) for i, name in enumerate(labels)}
                config["label2id"] = {str(name): i for i, name in enumerate(labels)}
        return state, config

    # -------------------------------------------------------------------------- files
    def write(self, folder: Path, config: dict[str, Any]) -> None:
        """tokenizer.json, tokenizer_config.json, special_tokens_map.json, the head, README.md."""
        if self.vocab is not None:
            n = config["n_positions"]
            self._write_tokenizer(folder, min(n, self.trained) if self.trained else n)
        if self.head is not None:
            save_file({k: v.contiguous() for k, v in self.head.items()}, str(folder / HEAD_FILE))
            files.follow_umask(folder / HEAD_FILE)  # safetensors writes 0600
            (folder / HEAD_INFO).write_text(json.dumps(self._head_info(), indent=2) + "\n")
        (folder / "README.md").write_text(model_card(self, config))

    def _write_tokenizer(self, folder: Path, max_length: int) -> None:
        from gpt1.text import hf_tokenizer

        encoder, merges = self.vocab
        hf_tokenizer.build(encoder, merges, self.specials).save(str(folder / "tokenizer.json"))
        unk = hf_tokenizer.unk_token(encoder) or hf_tokenizer.UNK
        start = "_start_" if "_start_" in self.specials else unk
        tokens = {"unk_token": unk, "bos_token": start, "eos_token": unk, "pad_token": unk}
        if self.specials:
            tokens["additional_special_tokens"] = list(self.specials)
        settings = {
            "tokenizer_class": "OpenAIGPTTokenizer",
            "model_max_length": max_length,
            "clean_up_tokenization_spaces": False,
            **tokens,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
        (folder / "special_tokens_map.json").write_text(json.dumps(tokens, indent=2) + "\n")

    def _head_info(self) -> dict[str, Any]:
        r = self.record
        return {
            "format": "gpt1-task-head",
            "kind": r["kind"],
            "task": r.get("task"),
            "labels": r.get("labels"),
            "n_outputs": r["n_outputs"],
            "tensors": {
                "linear.weight": "[n_outputs (1 for choice), n_embd]",
                "linear.bias": "[n_outputs (1 for choice)]",
            },
            "input_layout": KINDS[r["kind"]].layout,
            "formula": KINDS[r["kind"]].formula,
            "special_ids": {t: r["classify_id"] - 2 + i for i, t in enumerate(TASK_TOKENS)},
            "n_ctx": r.get("n_ctx"),
            "question_delimiter": r.get("question_delimiter", False),
            "in_model": "multiple_choice_head" if self.double_heads else None,
        }


def plan(
    src: str | Path, src_format: str, n_positions: int, vocab_dir: Path | None, path: str = "DIR"
) -> HFExport:
    """Decide the export of the model read from `src` (its `n_positions`, its vocabulary) into
    the folder the user named `path`."""
    export = HFExport(path=path)
    folder = resolve_checkpoint_dir(src) if src_format == "gpt1" else None
    if folder is not None and (folder / "task.json").is_file():
        _plan_head(export, folder)
    if folder is not None:
        window = trained_context(folder)
        if export.record is not None and isinstance(export.record.get("n_ctx"), int):
            window = export.record["n_ctx"]
        export.trained = window
        if window is not None and window < n_positions:
            export.notes.append(
                f"n_positions={n_positions} (the whole position table, as gpt1, serve and "
                f"ONNX accept); trained on windows of {window} tokens: model_max_length="
                f"{window}, rows {window}..{n_positions - 1} were never trained (lm-eval's hf "
                f"model: add max_length={window} to --model_args)"
            )
    if vocab_dir is not None:
        _plan_tokenizer(export, vocab_dir)
    return export


def _plan_head(export: HFExport, folder: Path) -> None:
    record, export.head = read_task_head(folder, model_config(open_checkpoint(folder)))
    export.record = record
    kind, n_out = record["kind"], record["n_outputs"]
    # The double-heads model's head reads one sequence's state, or scores each answer.
    sequences = KINDS[kind].sequences
    export.double_heads = sequences is None or (sequences == 1 and n_out == 1)
    if export.double_heads:
        export.notes.append(
            f"task head ({kind}): OpenAIGPTDoubleHeadsModel's multiple_choice_head "
            "(exact; pass mc_token_ids = the _classify_ positions); also in "
            f"{HEAD_FILE}"
        )
    else:
        why = (
            "it sums the two orders' states before the linear layer"
            if sequences == 2
            else "OpenAIGPTForSequenceClassification has no bias"
        )
        export.notes.append(
            f"task head ({kind}, {n_out} outputs): no transformers class has "
            f"its maths ({why}); exported the LM as OpenAIGPTLMHeadModel and the "
            f"head as {HEAD_FILE} + {HEAD_INFO}"
        )
        export.notes.append(RANDOM_HEAD_WARNING)


def _plan_tokenizer(export: HFExport, vocab_dir: Path) -> None:
    from gpt1.text.tokenizer import find_vocab_files, read_merges, read_vocab

    vocab_file, merges_file = find_vocab_files(vocab_dir)
    encoder = read_vocab(vocab_file)
    export.vocab = (encoder, read_merges(merges_file, encoder))
    if export.record is not None:
        export.specials = TASK_TOKENS
    export.notes.append(load_line())


def load_line(folder: str = "DIR") -> str:
    """How to load the export's tokenizer with exact ids (printed by convert, in the card)."""
    return (
        f"tokenizer: exact ids with AutoTokenizer.from_pretrained({folder}, use_fast=False) "
        "(needs ftfy + spacy) or gpt1.Tokenizer.from_dir; the default fast tokenizer "
        f"differs on {FAST_MISMATCH} of lines (see README.md)"
    )


def model_card(export: HFExport, config: dict[str, Any]) -> str:
    """README.md of the export folder."""
    from gpt1.text.hf_tokenizer import UNK

    start = "_start_" if export.specials else UNK
    arch = config["architectures"][0]
    lines = [
        "---",
        "library_name: transformers",
        "tags: [gpt1, openai-gpt]",
        "---",
        "",
        "# GPT-1 model exported by gpt1",
        "",
        f"`{arch}` with `n_positions={config['n_positions']}`, `n_embd={config['n_embd']}`, "
        f"`n_layer={config['n_layer']}`, `vocab_size={config['vocab_size']}`.",
        "",
        "## Tokenizer: getting the ids the model was trained on",
        "",
        "GPT-1's text pipeline is ftfy, OpenAI's `text_standardize`, spaCy's English tokenizer, "
        "lowercasing and BPE with `</w>`.",
        "",
        "- **Exact**: `AutoTokenizer.from_pretrained(DIR, use_fast=False)` (transformers' "
        "`OpenAIGPTTokenizer`) with `ftfy` and `spacy` installed (without them it silently falls "
        "back to a different pipeline), or `gpt1.Tokenizer.from_dir(DIR)`. One difference: "
        "transformers puts spaces around backslashes, OpenAI's code (and gpt1) does not.",
        f"- **Default** `AutoTokenizer.from_pretrained(DIR)` (fast, `tokenizer.json`): the same "
        "pipeline written with the `tokenizers` library; its ids differ from gpt1's on "
        f"{FAST_MISMATCH} of the distinct lines of gpt1's test text (novels, Wikipedia, GLUE, "
        "SNLI, SciTail, Story Cloze). What it cannot express: ftfy's repair of mis-decoded text "
        "(mojibake), HTML entities other than the common ones, and a few spaCy rules on words "
        "with several leading or trailing punctuation marks.",
        "- Neither adds special tokens to a text.",
        "",
        "## Start token and window",
        "",
        f"GPT-1 has no start-of-text token. `bos_token` is `{start}` for tools that score a "
        "text's first token after a start token (lm-evaluation-harness): "
        + (
            "every fine-tuning input starts with `_start_`."
            if export.specials
            else "`<unk>` stands for no text (gpt1 pads with it)."
        ),
        _window_line(export.trained, config["n_positions"]),
        "",
    ]
    if export.record is not None:
        lines += _head_section(export)
    notes = [n.replace("DIR", export.path) for n in export.notes]
    lines += ["## Notes from the export", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _window_line(trained: int | None, n_positions: int) -> str:
    if trained is None or trained >= n_positions:
        return (
            f"`n_positions` is {n_positions}"
            + (", the window the model was trained on." if trained else ".")
            + " `model_max_length` is the same."
        )
    return (
        f"`n_positions` is {n_positions}, the whole position table (gpt1, `gpt1 serve` and the "
        f"ONNX export accept as many tokens), but the model was trained on windows of {trained} "
        f"tokens: `model_max_length` is {trained}, and positions {trained}..{n_positions - 1} "
        f"were never trained. Keep inputs within {trained} tokens (lm-evaluation-harness: "
        f"`max_length={trained}`)."
    )


def _head_section(export: HFExport) -> list[str]:
    """The card's task head: layout, formula, the transformers class, and the loading code."""
    from gpt1.recipes.hf_snippet import example_call, loading_code

    r = export.record
    kind = KINDS[r["kind"]]
    lines = [
        "## Task head",
        "",
        f"Fine-tuned for `{r.get('task')}` ({r['kind']}, labels {r.get('labels')}). "
        f"Input layout: `{kind.layout}` (ids: `_start_`, `_delimiter_`, "
        f"`_classify_` = {r['classify_id'] - 2}, {r['classify_id'] - 1}, "
        f"{r['classify_id']}). {kind.formula}.",
        "",
    ]
    if export.double_heads:
        lines += [
            "The head is `OpenAIGPTDoubleHeadsModel.multiple_choice_head` (exact): "
            "feed `input_ids` `[batch, choices, T]` and `mc_token_ids` `[batch, "
            "choices]` (the `_classify_` positions); `mc_logits` are the scores.",
            "",
        ]
    else:
        lines += [
            "No transformers class computes this head, so the folder holds the LM "
            f"(`OpenAIGPTLMHeadModel`; its last hidden states are GPT-1's) and the head "
            f"in `{HEAD_FILE}` (`linear.weight`, `linear.bias`), described in "
            f"`{HEAD_INFO}`.",
            "",
            f"**{RANDOM_HEAD_WARNING.replace('DIR/README.md', 'this file')}.** "
            "`config.json`'s `id2label` names the classes, not a trained head.",
            "",
        ]
    code = loading_code(r, export.double_heads, export.path)
    lines += [
        "## Loading the classifier",
        "",
        "This gives what `gpt1 predict --format jsonl` writes (class probabilities, the score, "
        "or the answers' probabilities) for inputs that fit the window; gpt1 shortens a longer "
        "input's longest segment first.",
        "",
        "```python",
        code.rstrip("\n"),
        "",
        "",
        example_call(r),
        "```",
        "",
    ]
    return lines
