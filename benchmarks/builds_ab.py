r"""Two builds of gpt1's compiled kernels against each other, loaded in one process, rounds
alternating: the whole many-row int8 decoding step (`decode_step`, what `BatchedDecoder` runs
from the integer step's threshold on) at GPT-1 size, random weights, every sequence a slot of
one pool holding `--past` positions as the server's are.

A change to a kernel is measured this way rather than by two runs of a benchmark: on a shared
machine two runs minutes apart differ by more than most changes do. Each build is a folder that
`gpt1 kernels build` made (it holds the module's `.so`). From the repository's root, each
revision built into a folder of its own beside it, so the user's cache is left alone:

    git worktree add ../before HEAD~1
    (cd ../before && TORCH_EXTENSIONS_DIR=../builds/before python -m gpt1 kernels build)
    TORCH_EXTENSIONS_DIR=../builds/after python -m gpt1 kernels build
    python benchmarks/builds_ab.py ../builds/before/gpt1_matvec_* ../builds/after/gpt1_matvec_* \
        --threads 2

Prints, per row count, each build's median step and the ratio, and whether both gave the same
bits; with `--head`, the same for the output layer's int8 product on each build's own kernel.
The weights are packed once, by the build this checkout loads (`pack_vnni`'s layout must be the
same in both: a change to it is measured another way).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpt1 import GPT  # noqa: E402
from gpt1.config import model_preset  # noqa: E402
from gpt1.inference import block_step, int8_rows, int8_step  # noqa: E402
from gpt1.inference.decoding import decode  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_profile import CLOCKS, VOCAB, filled_pool  # noqa: E402

TABLE_HEAD = (
    "| rows | before ms | after ms | before / after | same bits |\n|---:|---:|---:|---:|---|"
)


def print_row(rows: int, times: dict[str, list[float]], out: dict[str, torch.Tensor]) -> None:
    """One row of the table: each build's median, their ratio, and whether their outputs are
    the same bits."""
    before, after = (statistics.median(times[name]) for name in ("before", "after"))
    same = torch.equal(out["before"], out["after"])
    print(
        f"| {rows} | {before * 1e3:.2f} | {after * 1e3:.2f} | {before / after:.3f}x |"
        f" {'yes' if same else 'no'} |",
        flush=True,
    )


def load_build(folder: Path) -> ModuleType:
    """The compiled module in `folder` (a `gpt1 kernels build` output), under its own name."""
    found = sorted(folder.glob("*.so"))
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one built module (.so), found {len(found)}")
    name = found[0].stem
    loader = importlib.machinery.ExtensionFileLoader(name, str(found[0]))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    if not module.has_decode_step():
        raise SystemExit(f"{folder}: this build has no decoding step for this CPU")
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="a build folder")
    ap.add_argument("after", type=Path, help="another build folder")
    ap.add_argument("--rows", default="8,16,32,64")
    ap.add_argument("--past", type=int, default=64, help="positions each cache holds")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--caches",
        choices=("decoder", "bf16", "activations"),
        default="decoder",
        help="what the caches store: BatchedDecoder's choice, bf16, or the activations' dtype",
    )
    ap.add_argument(
        "--clock", choices=tuple(CLOCKS), default=None, help="default: cpu on one thread, else wall"
    )
    ap.add_argument(
        "--head",
        action="store_true",
        help="also the output layer: the int8 head's product on each build's own kernel"
        " (`rows_product`, bf16 rows in, bf16 logits out, as the step's head takes it)",
    )
    args = ap.parse_args()
    if args.threads < 1 or args.rounds < 1 or args.past < 1:
        ap.error("--threads, --rounds and --past must be at least 1")
    clock_name = args.clock or ("cpu" if args.threads == 1 else "wall")
    if clock_name == "cpu" and args.threads > 1:
        ap.error("--clock cpu adds up every thread's time: give --clock wall with --threads")
    clock = CLOCKS[clock_name]
    builds = {"before": load_build(args.before), "after": load_build(args.after)}
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = for_inference(GPT(model_preset("gpt1").derive(vocab_size=VOCAB)), "cpu", "int8")
    print(
        f"GPT-1 size, int8, the many-row step over caches of {args.past} positions,"
        f" {args.threads} thread(s), {clock_name} time, medians of {args.rounds} alternating rounds"
    )
    print(f"before: {args.before.name}; after: {args.after.name}")
    print(TABLE_HEAD)
    for rows in [int(r) for r in args.rows.split(",")]:
        stored = {"decoder": int8_step.cache_dtype(model), "bf16": torch.bfloat16}
        caches = filled_pool(model, rows, args.past, stored.get(args.caches))
        ids = torch.randint(0, VOCAB, (rows,))
        times: dict[str, list[float]] = {name: [] for name in builds}
        out: dict[str, torch.Tensor] = {}
        # A build that refuses the step would hand it to torch's operators with a warning:
        # an error here, so that the operators are never timed in its name.
        with torch.no_grad(), int8_rows.per_row(), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            decode(model, ids, caches, one_call=False)  # the plan, packed copies, grown buffers
            step = block_step._plans[model].layout
            for round_ in range(args.rounds + 1):
                order = list(builds) if round_ % 2 == 0 else list(reversed(builds))
                for name in order:
                    step.op = builds[name].decode_step
                    start = clock()
                    try:
                        out[name] = decode(model, ids, caches, one_call=False)
                    except RuntimeWarning as refused:
                        raise SystemExit(
                            f"{name}: the build refused the step ({refused}); a build older than"
                            " int8 caches needs --caches bf16 (older than bf16 caches under fp32"
                            " activations: --caches activations)"
                        ) from None
                    if round_:  # the first round warms each build
                        times[name].append(clock() - start)
                    for cache in caches:
                        cache.truncate(args.past)
        print_row(rows, times, out)
    if args.head:
        time_head(model, builds, [int(r) for r in args.rows.split(",")], args.rounds, clock)


def time_head(model, builds: dict[str, ModuleType], counts: list[int], rounds: int, clock) -> None:
    """The output layer's int8 product of `counts` rows on each build's kernel, rounds
    alternating: the weights packed once by this checkout's build (the layout both read)."""
    head = model.lm_head_kernel
    packed = head._packed.few_rows(head.q)
    if packed.numel() == 0:
        raise SystemExit("--head: gpt1's int8 kernel is not compiled for this CPU")
    scale, vocab = head.scale.float(), head.q.shape[0]
    print(f"\nthe output layer ({vocab} x {head.q.shape[1]} int8), bf16 rows in and out")
    print(TABLE_HEAD)
    for rows in counts:
        hidden = torch.randn(rows, head.q.shape[1]).to(torch.bfloat16)
        times: dict[str, list[float]] = {name: [] for name in builds}
        out: dict[str, torch.Tensor] = {}
        for round_ in range(rounds + 1):
            for name in list(builds) if round_ % 2 == 0 else list(reversed(builds)):
                start = clock()
                out[name] = builds[name].rows_product(hidden, packed, scale, None, vocab)
                if round_:  # the first round warms each build
                    times[name].append(clock() - start)
        print_row(rows, times, out)


if __name__ == "__main__":
    main()
