"""The labelled-data curve (beyond the paper): dev metric against training examples, with and
without pretraining.

For each size (a seeded random subset of the training split; `all` = every example) and seed, two
`gpt1 finetune` sub-runs: `--init CKPT` (pretrained) and `--init CKPT --transfer-layers -1` (same
architecture and tokenizer, nothing transferred). Output: data_size.png (log x, mean +- std over
seeds), data_size.md, data_size.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpt1.analysis import report
from gpt1.analysis.runs import TaskSweep, headline
from gpt1.analysis.sweep import Sweep
from gpt1.errors import ConfigError

ARMS = {"pretrained": {}, "scratch": {"transfer_layers": -1}}


def parse_sizes(spec: str) -> list[int | None]:
    """'100,300,all' -> [100, 300, None] (None = all examples)."""
    sizes: list[int | None] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "all":
            sizes.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"--sizes: expected integers or 'all', got {part!r}") from None
        if value <= 0:
            raise ConfigError(f"--sizes: sizes must be positive, got {value}")
        sizes.append(value)
    if not sizes:
        raise ConfigError("--sizes: empty list")
    return sizes


def data_size_sweep(
    fixed: TaskSweep,
    out: str | Path,
    sizes: Sequence[int | None],
    seeds: Sequence[int] = (0, 1, 2),
    command: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the labelled-data sweep of `fixed`'s checkpoint and task; write plot and
    tables; return the table."""
    out, task = Path(out), fixed.task
    sweep = Sweep(out, "data-size", fixed.settings(), command)
    for size in sizes:
        label = "all" if size is None else str(size)
        for arm, extra in ARMS.items():
            for seed in seeds:
                run_dir = out / "runs" / f"{arm}-n{label}-seed{seed}"
                sub = fixed.sub_run(run_dir, seed, train_examples=size, **extra)

                def job(sub=sub) -> dict[str, Any]:
                    results = sub.run()
                    metric, value = headline(task, results)
                    return {
                        "metric": metric,
                        "value": value,
                        "train_n": results.get("train_n"),
                        "results": results,
                    }

                sweep.run(f"{arm}/n={label}/seed={seed}", sub.argv(), job, run_dir=run_dir)
    table = summarise(sweep, recorded_sizes(sweep, sizes), task)
    report.write_json(out / "data_size.json", table)
    report.write_text(out / "data_size.md", markdown(table))
    plot(table, out / "data_size.png")
    return table


def recorded_sizes(sweep: Sweep, asked: Sequence[int | None]) -> list[int | None]:
    """The sizes asked for now plus those earlier invocations into the folder finished, ascending
    (`None` = all, last): a sweep grown over several invocations is tabulated whole."""
    labels = {"all" if s is None else str(s) for s in asked}
    labels |= {key.split("/")[1][2:] for key in sweep.runs if key.count("/") == 2}
    numbers = sorted(int(label) for label in labels if label != "all")
    return numbers + ([None] if "all" in labels else [])


def summarise(sweep: Sweep, sizes: Sequence[int | None], task: str) -> dict[str, Any]:
    """Per size and arm: mean, std and count over every finished seed of that cell."""
    rows, metric = [], ""
    for size in sizes:
        label = "all" if size is None else str(size)
        row: dict[str, Any] = {"size": label}
        for arm in ARMS:
            done = [sweep.result(k) for k in sweep.done_with_prefix(f"{arm}/n={label}/seed=")]
            metric = done[0]["metric"] if done else metric
            mean, std = report.mean_std([r["value"] for r in done])
            # The real number of examples (`all`, or a size above the split's size).
            n = done[0]["train_n"] if done else size
            row[arm] = {"mean": mean, "std": std, "seeds": len(done), "train_n": n}
        rows.append(row)
    return {"task": task, "metric": metric, "rows": rows}


def markdown(table: dict[str, Any]) -> str:
    head = (
        f"Labelled-data curve ({table['task']}, dev {table['metric']} x 100; mean ± std over "
        "seeds)\n\n"
    )
    rows = [
        [
            r["size"],
            r["pretrained"]["train_n"] or r["scratch"]["train_n"] or "–",
            report.pct(r["pretrained"]["mean"], r["pretrained"]["std"]),
            report.pct(r["scratch"]["mean"], r["scratch"]["std"]),
            max(r["pretrained"]["seeds"], r["scratch"]["seeds"]),
        ]
        for r in table["rows"]
    ]
    return head + report.markdown_table(
        ["size", "examples", "pretrained", "no pretraining", "seeds"], rows
    )


def plot(table: dict[str, Any], png: Path) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, style in (("pretrained", "-"), ("scratch", "--")):
        pts = [
            (r[arm]["train_n"], r[arm]["mean"], r[arm]["std"])
            for r in table["rows"]
            if r[arm]["seeds"] and r[arm]["train_n"]
        ]
        if not pts:
            continue
        pts.sort()
        xs = [p[0] for p in pts]
        ys = [100 * p[1] for p in pts]
        sd = [100 * p[2] for p in pts]
        ax.plot(
            xs,
            ys,
            style,
            marker="o",
            label="pretrained" if arm == "pretrained" else "no pretraining",
        )
        ax.fill_between(
            xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], alpha=0.2
        )
    ax.set_xscale("log")
    ax.set_xlabel("labelled training examples")
    ax.set_ylabel(f"dev {table['metric']} (%)")
    ax.set_title(f"labelled-data curve: {table['task']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    report.save_figure(fig, png)
    plt.close(fig)
