"""Fig. 2 (left): fine-tune with the embeddings plus the first K pretrained blocks, K = 0..n_layer.

Each (K, seed) is one `gpt1 finetune --transfer-layers K` sub-run (the remaining blocks are freshly
initialised). The dev metric comes from the run's results.json; the train metric scores the
fine-tuned model on a fixed sample of its own training examples (`train_eval_examples`). Output:
layers.png (dev solid, train dashed, mean +- std over seeds), layers.md and layers.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpt1.analysis import report
from gpt1.analysis.runs import TaskSweep, headline, train_metric
from gpt1.analysis.sweep import Sweep


def layers_sweep(
    fixed: TaskSweep,
    out: str | Path,
    seeds: Sequence[int] = (0,),
    ks: Sequence[int] | None = None,
    train_examples: int | None = None,
    train_eval_examples: int = 1000,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the layers-transferred sweep of `fixed`'s checkpoint and task; write the
    plot and tables; return the table."""
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.model.checkpoint import model_config

    n_layer = model_config(open_checkpoint(fixed.init), "gpt").n_layer  # validated: K = 0..n_layer
    ks = list(range(n_layer + 1)) if ks is None else list(ks)
    out, task, data = Path(out), fixed.task, fixed.data
    settings = fixed.settings(
        train_examples=train_examples, train_eval_examples=train_eval_examples
    )
    sweep = Sweep(out, "layers", settings, command)
    for k in ks:
        for seed in seeds:
            run_dir = out / "runs" / f"k{k}-seed{seed}"
            sub = fixed.sub_run(run_dir, seed, transfer_layers=k, train_examples=train_examples)

            def job(sub=sub, run_dir=run_dir, seed=seed) -> dict[str, Any]:
                results = sub.run()
                metric, dev = headline(task, results)
                train = train_metric(
                    run_dir, data, fixed.train_split, train_eval_examples, seed, train_examples
                )
                return {
                    "metric": metric,
                    "dev": dev,
                    "train": train[metric],
                    "dev_results": results,
                    "train_results": train,
                }

            sweep.run(f"k={k}/seed={seed}", sub.argv(), job, run_dir=run_dir)
    recorded = {int(key.split("/")[0][2:]) for key in sweep.runs}  # "k=K/seed=S"
    table = summarise(sweep, sorted(set(ks) | recorded), task, n_layer)
    report.write_json(out / "layers.json", table)
    report.write_text(out / "layers.md", markdown(table))
    plot(table, out / "layers.png")
    return table


def summarise(sweep: Sweep, ks: Sequence[int], task: str, n_layer: int) -> dict[str, Any]:
    """Per K: mean and std over every finished seed (earlier invocations' seeds included)."""
    rows = []
    metric = ""
    for k in ks:
        done = [sweep.result(key) for key in sweep.done_with_prefix(f"k={k}/seed=")]
        metric = done[0]["metric"] if done else metric
        dev, dev_std = report.mean_std([r["dev"] for r in done])
        train, train_std = report.mean_std([r["train"] for r in done])
        rows.append(
            {
                "k": k,
                "dev": dev,
                "dev_std": dev_std,
                "train": train,
                "train_std": train_std,
                "seeds": len(done),
            }
        )
    return {"task": task, "metric": metric, "n_layer": n_layer, "rows": rows}


def markdown(table: dict[str, Any]) -> str:
    head = (
        f"Layers transferred ({table['task']}, {table['metric']}; embeddings + K of "
        f"{table['n_layer']} pretrained blocks; mean ± std over seeds)\n\n"
    )
    rows = [
        [
            r["k"],
            report.pct(r["dev"], r["dev_std"]),
            report.pct(r["train"], r["train_std"]),
            r["seeds"],
        ]
        for r in table["rows"]
    ]
    return head + report.markdown_table(["K", "dev", "train", "seeds"], rows)


def plot(table: dict[str, Any], png: Path) -> None:
    plt = report.pyplot()
    rows = [r for r in table["rows"] if r["seeds"]]
    ks = [r["k"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("dev", "-"), ("train", "--")):
        mean = [100 * r[key] for r in rows]
        std = [100 * r[f"{key}_std"] for r in rows]
        ax.errorbar(
            ks, mean, yerr=std, linestyle=style, marker="o", capsize=3, color="C0", label=f"{key}"
        )
    ax.set_xlabel("pretrained blocks transferred (K)")
    ax.set_ylabel(f"{table['metric']} (%)")
    ax.set_title(f"layers transferred: {table['task']}")
    ax.set_xticks(list(range(table["n_layer"] + 1)))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    report.save_figure(fig, png)
    plt.close(fig)
