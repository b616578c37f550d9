"""How often does a transformers export's tokenizer give other ids than gpt1's?

Exports a tiny model carrying the original GPT-1 vocabulary with `gpt1 convert --to hf`, then
encodes every distinct text line of ../shared/data (the lines of benchmarks/tokenizer.py --check:
novels, LAMBADA, Tiny Shakespeare, WikiText-2, GLUE, SNLI, SciTail, Story Cloze) with

- before: `AutoTokenizer.from_pretrained` on the folder as the export used to be (vocab.json +
  merges.txt only: transformers builds `OpenAIGPTTokenizerFast`, a BERT-style pipeline);
- after:  the default `AutoTokenizer.from_pretrained(EXPORT)` (our tokenizer.json);
- slow:   `AutoTokenizer.from_pretrained(EXPORT, use_fast=False)` with ftfy + spaCy (--slow);

and prints, per source, the lines whose ids differ from `gpt1.Tokenizer` (default settings).

    python benchmarks/hf_tokenizer_parity.py            # before and after
    python benchmarks/hf_tokenizer_parity.py --slow     # also the slow tokenizer (minutes)
    python benchmarks/hf_tokenizer_parity.py --limit 20000 --examples 20
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def export_tiny(vocab: Path, out: Path) -> Path:
    """A tiny random model with the original vocabulary, exported like any checkpoint."""
    import torch

    from gpt1 import GPT, ModelConfig, save_model
    from gpt1.recipes.convert import convert

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40478, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    save_model(model, out / "ckpt", tokenizer_dir=vocab)
    return convert(out / "ckpt", out / "hf", "gpt1", "hf")


def old_export(export: Path, out: Path) -> Path:
    """The export as it was before tokenizer.json: weights, config, vocab.json, merges.txt."""
    old = out / "old"
    old.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        (old / name).symlink_to(export / name)
    return old


def lines_of(data: Path, limit: int | None) -> list[tuple[str, str]]:
    from tokenizer import text_units  # benchmarks/tokenizer.py: the same lines as --check

    seen: dict[str, str] = {}
    for source, text in text_units(data):
        if text.strip() and text not in seen:
            seen[text] = source
    items = [(s, t) for t, s in seen.items()]
    if limit is not None and limit < len(items):
        items = random.Random(0).sample(items, limit)
    return items


def compare(
    name: str, items: list[tuple[str, str]], want: list[list[int]], encode, examples: int, show
) -> int:
    t0 = time.perf_counter()
    got = encode([t for _, t in items])
    seconds = time.perf_counter() - t0
    per_source: dict[str, list[int]] = {}
    bad = []
    for i, ((source, _), a, b) in enumerate(zip(items, want, got)):
        s = per_source.setdefault(source, [0, 0])
        s[0] += 1
        if a != b:
            s[1] += 1
            bad.append(i)
    total = len(items)
    print(
        f"\n{name}: {len(bad):,} of {total:,} lines differ ({100 * len(bad) / total:.3f}%), "
        f"{seconds:.0f} s"
    )
    for source, (n, k) in per_source.items():
        print(f"  {source:12s} {k:7,d} / {n:7,d}  ({100 * k / n:.3f}%)")
    for i in bad[:examples]:
        show(items[i][1], want[i], got[i])
    return len(bad)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slow", action="store_true", help="also use_fast=False (ftfy + spaCy)")
    parser.add_argument("--limit", type=int, default=None, help="a random sample of N lines")
    parser.add_argument("--examples", type=int, default=3, help="differing lines to print")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    vocab = args.data / "gpt1_tokenizer"
    if not vocab.is_dir():
        raise SystemExit(f"shared data not found at {args.data} (set GPT1_SHARED_DATA)")
    import transformers
    from transformers import AutoTokenizer

    from gpt1.text.tokenizer import Tokenizer

    transformers.logging.set_verbosity_error()
    tok = Tokenizer.from_dir(vocab)
    items = lines_of(args.data, args.limit)
    t0 = time.perf_counter()
    want = [tok.encode(t) for _, t in items]
    print(f"{len(items):,} distinct lines; gpt1.Tokenizer {time.perf_counter() - t0:.0f} s")

    def show(text: str, a: list[int], b: list[int]) -> None:
        j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        around = slice(max(0, j - 1), j + 3)
        print(
            f"    {text[:90]!r}\n      gpt1 {[tok.decoder.get(i) for i in a[around]]}"
            f"  hf {[tok.decoder.get(i) for i in b[around]]}"
        )

    with tempfile.TemporaryDirectory() as tmp:
        export = export_tiny(vocab, Path(tmp))
        before = AutoTokenizer.from_pretrained(old_export(export, Path(tmp)))
        after = AutoTokenizer.from_pretrained(export)
        print(f"before: {type(before).__name__}; after: {type(after).__name__}")

        def fast(hf):
            return lambda texts: hf(texts, add_special_tokens=False)["input_ids"]

        compare(
            "before (vocab.json + merges.txt, default AutoTokenizer)",
            items,
            want,
            fast(before),
            args.examples,
            show,
        )
        bad = compare(
            "after (tokenizer.json, default AutoTokenizer)",
            items,
            want,
            fast(after),
            args.examples,
            show,
        )
        if args.slow:
            slow = AutoTokenizer.from_pretrained(export, use_fast=False)
            if slow.fix_text is None:
                raise SystemExit(
                    "the slow tokenizer fell back to BasicTokenizer: install ftfy and spacy"
                )
            compare(
                "slow (use_fast=False, ftfy + spaCy)",
                items,
                want,
                lambda texts: [slow.encode(t) for t in texts],
                args.examples,
                show,
            )
    return 1 if bad > 0.01 * len(items) else 0


if __name__ == "__main__":
    sys.exit(main())
