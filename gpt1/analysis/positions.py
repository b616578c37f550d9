"""Learned position embeddings, made visible: 2-D projection and cosine-similarity matrix.

`analyse_positions(checkpoint, out)` writes:
  positions_2d.png      the `wpe` rows projected to 2-D (t-SNE from scikit-learn; PCA when t-SNE
                        is unavailable, fails, or `method="pca"`), each point coloured by position;
  positions_cosine.png  the [n_positions, n_positions] cosine-similarity matrix;
  positions.json        a summary: the method used, mean cosine similarity of neighbouring rows
                        vs. distant rows, the mean similarity by offset, how often a row's most
                        similar other row is within 2 positions, and PCA's explained variance.
A trained GPT's positions lie on a smooth low-dimensional curve (neighbours similar, distant rows
not); a freshly initialised table shows none of that, which the summary makes checkable.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt1.config import check_seed
from gpt1.errors import CheckpointError, ConfigError
from gpt1.files import write_json
from gpt1.train.telemetry import save_figure

log = logging.getLogger(__name__)


def position_table(checkpoint: str | Path, max_positions: int | None = None) -> np.ndarray:
    """The learned position embeddings `[n_positions, n_embd]` of a checkpoint, as float64."""
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.model.checkpoint import load_model

    model = load_model(open_checkpoint(checkpoint))
    if not hasattr(model, "wpe"):
        raise CheckpointError(
            f"{checkpoint}: this model has no position embeddings "
            "(an LSTM is ordered by its recurrence)"
        )
    table = model.wpe.weight.detach().to(torch.float64).cpu().numpy()
    if max_positions is not None and max_positions > table.shape[0]:
        raise ConfigError(
            f"--max-positions {max_positions} is more than the {table.shape[0]} positions "
            f"of {checkpoint}"
        )
    return table[:max_positions]


def cosine_matrix(table: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair of rows: `[N, C]` -> `[N, N]`."""
    norms = np.linalg.norm(table, axis=1, keepdims=True)
    unit = table / np.maximum(norms, 1e-12)
    return unit @ unit.T


def summarise(
    cos: np.ndarray, offsets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
) -> dict[str, Any]:
    """Neighbour vs distant similarity, similarity by offset, nearest-neighbour locality."""
    n = cos.shape[0]
    by_offset = {str(d): float(np.mean(np.diagonal(cos, offset=d))) for d in offsets if d < n}
    far = n // 2
    distant = [np.diagonal(cos, offset=d) for d in range(max(far, 1), n)]
    others = cos - 2.0 * np.eye(n)  # exclude each row itself from its nearest neighbour
    nearest = np.argmax(others, axis=1)
    local = float(np.mean(np.abs(nearest - np.arange(n)) <= 2)) if n > 1 else float("nan")
    return {
        "n_positions": n,
        "mean_cos_neighbours": by_offset.get("1", float("nan")),
        "mean_cos_distant": float(np.mean(np.concatenate(distant))) if distant else float("nan"),
        "distant_means_offset_at_least": far,
        "mean_cos_by_offset": by_offset,
        "nearest_within_2": local,
    }


def project_2d(table: np.ndarray, method: str = "tsne", seed: int = 0) -> tuple[np.ndarray, str]:
    """2-D coordinates of the rows and the method that produced them ("tsne" or "pca")."""
    if method not in ("tsne", "pca"):
        raise ConfigError(f"unknown projection {method!r}; choose tsne or pca")
    problem = tsne_problem(table) if method == "tsne" else None
    if problem:
        log.warning("t-SNE cannot run on these rows (%s); PCA instead", problem)
    elif method == "tsne":
        try:
            from sklearn.manifold import TSNE

            perplexity = float(min(30, (table.shape[0] - 1) / 3))
            # Cosine distances ignore each row's length, so t-SNE is given the unit rows: the
            # same distances, and a PCA start that stays finite at any scale (1e300 overflows).
            coords = TSNE(
                n_components=2,
                perplexity=perplexity,
                init="pca",
                random_state=seed,
                metric="cosine",
            ).fit_transform(unit_rows(table))
            return coords, "tsne"
        except (ImportError, ValueError) as exc:  # sklearn missing, or a seed it refuses
            log.warning("t-SNE unavailable (%s); falling back to PCA", exc)
    return pca(table, 2)[0], "pca"


def tsne_problem(table: np.ndarray) -> str | None:
    """Why t-SNE cannot run on `table`'s rows, or None. Checked here because sklearn's native
    code crashes the process (a segfault, no exception) on rows that all point one way."""
    if table.shape[0] < 5:
        return f"{table.shape[0]} rows, t-SNE needs at least 5"
    if not np.isfinite(table).all():
        return "values that are not finite"
    if not np.abs(table).max(axis=1).all():
        return "a row of zeros has no direction"
    if np.ptp(unit_rows(table), axis=0).max() < 1e-6:
        return "all rows point the same way"
    return None


def unit_rows(table: np.ndarray) -> np.ndarray:
    """Each row divided by its length (rows of zeros stay zero), at any scale: each row is
    first divided by its largest entry, so that no length under- or overflows."""
    peak = np.abs(table).max(axis=1, keepdims=True)
    scaled = table / np.where(peak > 0, peak, 1.0)
    return scaled / np.maximum(np.linalg.norm(scaled, axis=1, keepdims=True), 1e-300)


def pca(table: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-`k` principal-component coordinates `[N, k]` and the explained-variance ratios `[k]`."""
    centred = table - table.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    var = s**2
    ratio = var[:k] / max(var.sum(), 1e-300)
    return centred @ vt[:k].T, ratio


OUTPUTS = ("positions_2d.png", "positions_cosine.png", "positions.json")


def check_positions_out(out: str | Path, overwrite: bool) -> None:
    """Refuse to replace the files `analyse_positions` writes unless `overwrite`."""
    from gpt1.files import check_output

    for name in OUTPUTS:
        check_output(Path(out) / name, overwrite)


def check_settings(max_positions: int | None, seed: int) -> None:
    """Refuse, before anything is read or written, what no projection can be made with."""
    if max_positions is not None and max_positions < 2:
        raise ConfigError(
            f"--max-positions must be at least 2 (two points to project), got {max_positions}"
        )
    check_seed(seed, "--seed")


def analyse_positions(
    checkpoint: str | Path,
    out: str | Path,
    method: str = "tsne",
    max_positions: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Write the two PNGs and positions.json for `checkpoint` into `out`; return the summary."""
    out = Path(out)
    check_settings(max_positions, seed)
    table = position_table(checkpoint, max_positions)  # read first: a refusal makes no folder
    out.mkdir(parents=True, exist_ok=True)
    cos = cosine_matrix(table)
    coords, used = project_2d(table, method, seed)
    summary = summarise(cos)
    summary.update(
        checkpoint=str(checkpoint),
        method=used,
        n_embd=int(table.shape[1]),
        pca_explained_variance=[float(x) for x in pca(table, 3)[1]],
    )
    _plot(coords, cos, used, out, title=Path(checkpoint).name or str(checkpoint))
    summary["files"] = ["positions_2d.png", "positions_cosine.png"]
    write_json(out / "positions.json", summary)
    return summary


def _plot(coords: np.ndarray, cos: np.ndarray, method: str, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = coords.shape[0]
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.plot(coords[:, 0], coords[:, 1], color="0.8", linewidth=0.5, zorder=1)
    points = ax.scatter(coords[:, 0], coords[:, 1], c=np.arange(n), cmap="viridis", s=12, zorder=2)
    fig.colorbar(points, ax=ax, label="position")
    ax.set_title(f"position embeddings ({method.upper()}), {title}")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    save_figure(fig, out / "positions_2d.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 5))
    image = ax.imshow(cos, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, label="cosine similarity")
    ax.set_xlabel("position")
    ax.set_ylabel("position")
    ax.set_title(f"position-embedding cosine similarity, {title}")
    fig.tight_layout()
    save_figure(fig, out / "positions_cosine.png")
    plt.close(fig)
