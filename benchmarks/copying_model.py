"""Train a small model to continue a passage it has been shown, for `benchmarks/speculative.py`'s
copy-heavy text. With 4 blocks (`--blocks 4`) it gives one that copies across a paragraph; with
2 (the default, kept so the earlier figures can be run again) the copying fades as the windows
grow.

Drafts from the text pay where the model continues a passage it has been shown. Large
pretrained models learn to by themselves (attention heads that find where the current token
occurred before and predict what followed it); a small model pretrained here for minutes does
not. This trains the project's GPT (`--blocks` blocks x 256 wide, 4 heads, 256 positions, no
dropout, AdamW, 2,048 tokens an update) on windows cut from the novels of a folder (all but
`--leave-out`, the novel `speculative.py` reads, so the benchmark's passages are unseen): a
quarter of them plain text, the others a few plain tokens and then one passage (3 tokens to
half a window's, or to a stage's own longest), given again until the window is full (with
`--gaps`, half of them with a paragraph break between the copies, as the benchmark's prompts
have). The windows grow in stages (`--stages`, window:updates or window:updates:longest
passage); `--init` starts from a saved model, `--positions-only` trains its position table
alone, `--sinusoid-positions` starts a new model's position table as sines and cosines. It
prints the greedy accuracy on the second copy of held-out passages of 15 and 100 tokens given
twice, and saves a checkpoint folder every command loads (`gpt1 sample`,
`speculative.py --checkpoint`). Its figures: docs/results.md ("Speculative decoding").

    gpt1 tokenizer train --corpus NOVELS --merges 4000 --strip-gutenberg --out copying/vocab
    python benchmarks/copying_model.py NOVELS --tokenizer copying/vocab --out copying/four \
        --blocks 4
    python benchmarks/copying_model.py NOVELS --tokenizer copying/vocab --out copying/model \
        --init copying/four --stages 256:400 --lr 3e-4 --gaps
    python benchmarks/speculative.py --checkpoint copying/model --threads 1 --clock cpu \
        --rounds 5 --paragraphs 12

NOVELS: a folder of Project Gutenberg .txt novels (docs/results.md: the shared corpus's 13 of
at most 1.1 MB; Pride and Prejudice, the default `--leave-out`, is not trained on).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpt1.checkpoint_files import open_checkpoint  # noqa: E402
from gpt1.config import ModelConfig  # noqa: E402
from gpt1.model.checkpoint import load_model, save_model  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402
from gpt1.text.prepare import strip_gutenberg  # noqa: E402
from gpt1.text.tokenizer import Tokenizer  # noqa: E402

TOKENS_PER_UPDATE = 2048  # windows of T tokens: 2048 // T of them an update
PLAIN_SHARE = 0.25  # windows of plain text, so the model still models prose
HELD_OUT = 0.05  # the end of each novel, for the copy figure


def novel_tokens(folder: Path, leave_out: str, tokenizer: Tokenizer) -> tuple[np.ndarray, ...]:
    """(training tokens, held-out tokens): each novel's text between the Gutenberg markers,
    its last HELD_OUT held out."""
    train, held = [], []
    for path in sorted(folder.glob("*.txt")):
        if path.name == leave_out:
            continue
        text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
        ids = np.asarray(tokenizer.encode(strip_gutenberg(text) or text), dtype=np.int64)
        cut = int(len(ids) * (1 - HELD_OUT))
        train.append(ids[:cut])
        held.append(ids[cut:])
        print(f"{path.name}: {len(ids):,} tokens", flush=True)
    return np.concatenate(train), np.concatenate(held)


def windows(
    tokens: np.ndarray,
    n: int,
    T: int,
    longest: int,
    rng: np.random.Generator,
    gap: np.ndarray | None = None,
) -> torch.Tensor:
    """n windows of T + 1 tokens: plain text, or a few plain tokens and then one passage of
    3 to `longest` tokens given again until the window is full (in half of them, where `gap`
    is given, with those tokens, a paragraph break, between the copies)."""
    out = []
    for _ in range(n):
        if rng.random() < PLAIN_SHARE:
            start = rng.integers(0, len(tokens) - T - 1)
            out.append(tokens[start : start + T + 1])
            continue
        length = int(rng.integers(3, longest + 1))
        start = rng.integers(0, len(tokens) - length)
        passage = tokens[start : start + length]
        lead_at = rng.integers(0, len(tokens) - T)
        lead = tokens[lead_at : lead_at + int(rng.integers(0, T // 6 + 1))]
        if gap is not None and rng.random() < 0.5:
            passage = np.concatenate([passage, gap])
        out.append(np.concatenate([lead] + [passage] * (T // length + 2))[: T + 1])
    return torch.from_numpy(np.stack(out))


@torch.no_grad()
def copy_accuracy(model: GPT, held: np.ndarray, length: int, n: int = 32) -> float:
    """Greedy accuracy on the second copy of n held-out passages of `length` tokens given
    twice (the first token of the second copy is not counted: nothing before it says the
    passage starts again)."""
    model.eval()
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(n):
        start = rng.integers(0, len(held) - length)
        passage = torch.from_numpy(held[start : start + length])
        x = torch.cat([passage, passage])[None]
        guess = model.lm_logits(model(x[:, :-1]))[0, length:].argmax(-1)
        hits += int((guess == x[0, length + 1 :]).sum())
    model.train()
    return hits / (n * (length - 1))


def sinusoid_table(positions: int, width: int, rms: float = 0.02) -> torch.Tensor:
    """The Transformer paper's sines and cosines, scaled to the token table's initial size.
    Still a learned table, only started here: one position's row is a fixed rotation of the
    row before it, so an attention head that finds "the position before mine" (the first
    step of copying) can do so with one map at every position, rather than learning it
    position by position as a table started at random must."""
    position = torch.arange(positions, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-np.log(10000.0) / width))
    table = torch.zeros(positions, width)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table * (rms / table.pow(2).mean().sqrt())


def shifted_hidden(model: GPT, ids: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """The model's hidden states for windows ids `[B, T]`, each window at positions starting
    where `rng` says (anywhere it fits in the table), not at 0: short windows then train every
    row of the position table."""
    B, T = ids.shape
    starts = torch.from_numpy(rng.integers(0, model.config.n_positions - T + 1, size=(B, 1)))
    x, _ = model.embed(ids, starts + torch.arange(T))
    for block in model.h:
        x = block(x)
    return x


def train_stage(
    model, opt, tokens, held, T, longest, steps, rng, warmup=0, every=100, shift=False, gap=None
) -> None:
    start = time.perf_counter()
    peak = opt.param_groups[0]["lr"]
    for step in range(1, steps + 1):
        for group in opt.param_groups:  # post-LN blocks need a warm-up at this rate
            group["lr"] = peak * min(1.0, step / warmup) if warmup else peak
        x = windows(tokens, TOKENS_PER_UPDATE // T, T, longest, rng, gap)
        hidden = shifted_hidden(model, x[:, :-1], rng) if shift else model(x[:, :-1])
        logits = model.lm_logits(hidden)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], 1.0)
        opt.step()
        if step % every == 0 or step == steps:
            short = copy_accuracy(model, held, 15)
            long = copy_accuracy(model, held, 100) if T >= 128 else float("nan")
            print(
                f"  window {T}, passages of 3-{longest}, update {step}: "
                f"loss {loss.item():.3f}, copy {short:.2f} "
                f"(15 tokens) {long:.2f} (100), {time.perf_counter() - start:.0f} s",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a folder of .txt novels (Project Gutenberg)")
    ap.add_argument("--tokenizer", required=True, help="a tokenizer folder (gpt1 tokenizer train)")
    ap.add_argument("--out", type=Path, required=True, help="a new checkpoint folder")
    ap.add_argument("--leave-out", default="1342-0.txt", help="a novel not to train on")
    ap.add_argument(
        "--stages",
        default="32:1200,64:300,128:300,256:400",
        help="window:updates[:longest passage, default half the window], in order",
    )
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--later-lr", type=float, default=6e-4, help="after the first stage")
    ap.add_argument("--init", help="start from this checkpoint's weights")
    ap.add_argument("--positions-only", action="store_true", help="train the position table alone")
    ap.add_argument(
        "--sinusoid-positions",
        action="store_true",
        help="start the position table as sines and cosines (a new model only)",
    )
    ap.add_argument(
        "--shift-windows",
        action="store_true",
        help="place each window at a random place in the position table, not at its start",
    )
    ap.add_argument("--blocks", type=int, help="a new model's blocks (1-12; 2 by default)")
    ap.add_argument(
        "--gaps",
        action="store_true",
        help="a paragraph break between a passage's copies in half of the windows",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.blocks is not None and not 1 <= args.blocks <= 12:
        ap.error(f"--blocks {args.blocks}: 1 to 12")
    if args.init and args.blocks is not None:
        ap.error("--blocks shapes a new model; --init loads a trained one as it is")
    if args.out.exists():
        sys.exit(f"{args.out} exists: choose a new folder")
    try:
        stages = [tuple(int(n) for n in stage.split(":")) for stage in args.stages.split(",")]
    except ValueError:
        ap.error(f"--stages {args.stages!r}: expected window:updates,... (whole numbers)")
    if any(
        len(st) not in (2, 3)
        or not 8 <= st[0] <= 256
        or st[1] < 1
        or (len(st) == 3 and not 3 <= st[2] <= st[0])
        for st in stages
    ):
        ap.error(
            f"--stages {args.stages!r}: windows of 8-256 tokens, at least one update each,"
            " passages of 3 tokens up to the window"
        )
    if args.sinusoid_positions and args.init:
        ap.error("--sinusoid-positions starts a new model's table; --init loads a trained one")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = Tokenizer.from_dir(args.tokenizer)
    tokens, held = novel_tokens(args.folder, args.leave_out, tokenizer)
    config = ModelConfig(
        vocab_size=len(tokenizer.encoder),
        n_positions=256,
        n_embd=256,
        n_layer=args.blocks or 2,
        n_head=4,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = GPT(config) if not args.init else load_model(open_checkpoint(args.init))
    if args.sinusoid_positions:
        with torch.no_grad():
            model.wpe.weight.copy_(sinusoid_table(*model.wpe.weight.shape))
    if args.positions_only:  # the blocks and token table as they are: only positions learn
        for name, param in model.named_parameters():
            param.requires_grad_(name == "wpe.weight")
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.01)
    rng = np.random.default_rng(args.seed)
    gap = np.asarray(tokenizer.encode("\n\n"), dtype=np.int64) if args.gaps else None
    for i, (T, updates, *longest) in enumerate(stages):
        longest = longest[0] if longest else T // 2
        if i:
            for group in opt.param_groups:
                group["lr"] = args.later_lr
        print(f"{updates} updates of {TOKENS_PER_UPDATE // T} windows of {T} tokens", flush=True)
        warmup = 0 if i else 100
        train_stage(
            model,
            opt,
            tokens,
            held,
            T,
            longest,
            updates,
            rng,
            warmup,
            shift=args.shift_windows,
            gap=gap,
        )
    save_model(model, args.out, args.tokenizer)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
