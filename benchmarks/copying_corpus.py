"""A training text that teaches a small model to continue a passage it has been shown, for
`benchmarks/speculative.py`'s copy-heavy text.

Large pretrained models learn to copy a passage of their context by themselves (the attention
heads that find where the current tokens occurred before and predict what followed). A model
small and short-trained enough to pretrain here on two CPU cores does not: one trained on plain
novels accepted under half of the drafts on text that repeats. This writes the novels of a
folder as they are, except that about half of their paragraphs (chosen at random, seeded) are
followed by themselves again, so that copying is worth learning and the model must tell from its
context when it applies; and after about half of them comes a run of the novel's words drawn at
random, written twice, which only copying predicts (without these, 1,200 updates did not teach
the model here to copy at all). One novel is left out (`--leave-out`, by default the one the benchmark
reads), so the benchmark's passages are text the model has never seen.

The model of docs/results.md ("Speculative decoding"): the twelve novels of at most 1.1 MB, a
vocabulary of 4,000 merges, 4 blocks 256 wide, 1,200 updates of 32 x 256 tokens (about 20
minutes on two cores):

    python benchmarks/copying_corpus.py ../shared/data/corpus/gutenberg --out copying/corpus \
        --max-bytes 1100000
    gpt1 tokenizer train --corpus copying/corpus --merges 4000 --out copying/vocab
    gpt1 pretrain --preset mini --data copying/corpus --tokenizer copying/vocab \
        --set model.n_layer=4 --set model.n_embd=256 --set model.n_head=4 \
        --set model.n_positions=256 --set data.n_ctx=256 --max-steps 1200 --precision bf16 \
        --out copying/run
    python benchmarks/speculative.py --checkpoint copying/run --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpt1.text.prepare import strip_gutenberg  # noqa: E402


def doubled(text: str, rng: random.Random, share: float, drill: float) -> str:
    """`text`'s paragraphs (blank-line separated), a `share` of them written twice, and after
    a `drill` share of them a run of 20-60 of the text's words drawn at random, written twice
    (only copying predicts its second half: the signal that teaches copying quickly)."""
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    words = text.split()
    out = []
    for para in paragraphs:
        out.append(para)
        if rng.random() < share:
            out.append(para)
        if rng.random() < drill:
            run = " ".join(rng.choice(words) for _ in range(rng.randint(20, 60)))
            out += [run, run]
    return "\n\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a folder of .txt novels (Project Gutenberg)")
    ap.add_argument("--out", type=Path, required=True, help="a new folder for the .txt files")
    ap.add_argument("--leave-out", default="1342-0.txt", help="a novel not to write")
    ap.add_argument("--share", type=float, default=0.5, help="paragraphs written twice")
    ap.add_argument("--drill", type=float, default=0.5, help="paragraphs followed by a random run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-bytes", type=int, default=None, help="novels up to this size only")
    args = ap.parse_args()
    if args.out.exists():
        sys.exit(f"{args.out} exists: choose a new folder")
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True)
    for path in sorted(args.folder.glob("*.txt")):
        if path.name == args.leave_out or (args.max_bytes and path.stat().st_size > args.max_bytes):
            continue
        text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
        body = strip_gutenberg(text)
        (args.out / path.name).write_text(doubled(body or text, rng, args.share, args.drill), encoding="utf-8")
        print(f"{path.name}: written")


if __name__ == "__main__":
    main()
