"""What ``poolgrad study shift`` writes from its runs: ``results.json`` (every run and
every cell's mean and spread), ``table.md``, the plots, and ``findings.md``, the
seed's claims checked against the numbers.

A cell is a (dataset, downsampling, head); its figures are the mean and the spread
(the sample standard deviation) over its seeds. Two cells differ *beyond the spread*
when their means are further apart than the sum of their spreads; the findings call
nothing else a difference.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..tools.figures import figure_class, save_png
from ..tools.files import write_atomically

METRICS = {"test_accuracy": "accuracy", "consistency": "consistency",
           "flip_1px": "1-px flips", "stride_agreement": "agreement at the stride",
           "layer_1px": "layer unchanged, 1 px", "layer_2px": "layer unchanged, 2 px",
           "circular_invariant": "unchanged by every circular shift",
           "circular_flips": "circular flips"}
FILES = {"results": "results.json", "table": "table.md", "findings": "findings.md",
         "zero": "consistency_vs_shift_zero.png",
         "circular": "consistency_vs_shift_circular.png",
         "scatter": "accuracy_vs_consistency.png"}


def check_plotting(error=ValueError) -> None:
    """Fail before the runs, not after them, when matplotlib is missing."""
    figure_class("the study's plots", "train", error)


def _figures_of(record: dict) -> dict:
    natural = record["curves"][record["mode"]]
    layer = dict(zip(record["layer"]["shift"], record["layer"]["unchanged"], strict=True))
    return {"test_accuracy": record["test_accuracy"], "consistency": record["consistency"],
            "flip_1px": record["flip_1px"],
            "stride_agreement": natural["agreement"][record["stride"]],
            "layer_1px": layer[1], "layer_2px": layer[2],
            "circular_invariant": record["circular"]["invariant"],
            "circular_flips": record["circular"]["flips"]}


def cells(records: list[dict]) -> list[dict]:
    """One entry per (dataset, pool, head), in the order of the runs: each metric's
    mean and spread over the seeds, and the mean curves."""
    grouped = {}
    for record in records:
        grouped.setdefault((record["dataset"], record["pool"], record["head"]), []).append(
            record)
    result = []
    for (dataset, pool, head), runs in grouped.items():
        figures = [_figures_of(run) for run in runs]
        cell = {"dataset": dataset, "pool": pool, "head": head, "seeds": len(runs),
                "mode": runs[0]["mode"], "stride": runs[0]["stride"]}
        for metric in METRICS:
            values = np.array([f[metric] for f in figures])
            cell[metric] = {"mean": float(values.mean()),
                            "spread": float(values.std(ddof=1)) if len(values) > 1 else 0.0}
        cell["curves"] = {mode: {"shift": runs[0]["curves"][mode]["shift"], "agreement": [
            float(v) for v in np.mean([run["curves"][mode]["agreement"] for run in runs], 0)]}
            for mode in runs[0]["curves"]}
        result.append(cell)
    return result


def _percent(figure: dict) -> str:
    return f"{100 * figure['mean']:.1f} ± {100 * figure['spread']:.1f}"


def main_table(summary: list[dict], head: str = "flatten") -> str:
    """Markdown: per downsampling with ``head``, each dataset's accuracy and
    consistency and the 1-px flips, in % as mean ± spread."""
    datasets = list(dict.fromkeys(c["dataset"] for c in summary))
    index = {(c["dataset"], c["pool"], c["head"]): c for c in summary}
    columns = [(d, m) for d in datasets for m in ("test_accuracy", "consistency", "flip_1px")]
    lines = ["| downsampling | " + " | ".join(f"{d}: {METRICS[m]}" for d, m in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for pool in dict.fromkeys(c["pool"] for c in summary):
        if all((d, pool, head) in index for d in datasets):
            lines.append(f"| {pool} | " + " | ".join(
                _percent(index[d, pool, head][m]) for d, m in columns) + " |")
    return "\n".join(lines)


def heads_table(summary: list[dict]) -> str:
    """Markdown: per head, each dataset's accuracy and consistency pooled over every
    downsampling (the mean of the cells' means ± the root mean square of their
    spreads)."""
    from .findings import Cells
    cells = Cells(summary)
    columns = [(d, m) for d in cells.datasets for m in ("test_accuracy", "consistency")]
    lines = ["| head | " + " | ".join(f"{d}: {METRICS[m]}" for d, m in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for head in cells.heads:
        figures = [cells.figure(m, [d], heads=[head]) for d, m in columns]
        lines.append(f"| {head} | " + " | ".join(
            _percent({"mean": f[0], "spread": f[1]}) for f in figures) + " |")
    return "\n".join(lines)


def table(summary: list[dict]) -> str:
    """The cells as Markdown: the main table (the flatten head), the heads pooled over
    the downsamplings, then a table per dataset; every figure in % as mean ± spread."""
    lines = ["## Every downsampling, flatten head", "", main_table(summary), "",
             "## Every head, pooled over the downsamplings", "", heads_table(summary), "",
             "## Every cell", ""]
    for dataset in dict.fromkeys(c["dataset"] for c in summary):
        rows = [c for c in summary if c["dataset"] == dataset]
        lines += [f"### {dataset} ({rows[0]['seeds']} seeds; shifts {rows[0]['mode']}; "
                  f"total stride {rows[0]['stride']})", "",
                  "| downsampling | head | " + " | ".join(METRICS.values()) + " |",
                  "|---|---|" + "---:|" * len(METRICS)]
        lines += [f"| {c['pool']} | {c['head']} | " + " | ".join(
            _percent(c[m]) for m in METRICS) + " |" for c in rows]
        lines.append("")
    return "\n".join(lines)


def plot_curves(summary: list[dict], mode: str, path: str) -> str:
    """Agreement with the unshifted prediction against the shift, a line per
    downsampling; a panel per dataset (rows) and head (columns)."""
    datasets = list(dict.fromkeys(c["dataset"] for c in summary))
    heads = list(dict.fromkeys(c["head"] for c in summary))
    pools = list(dict.fromkeys(c["pool"] for c in summary))
    figure = figure_class("the study's plots", "train")(
        figsize=(4.2 * len(heads), 3.2 * len(datasets)))
    axes = np.array(figure.subplots(len(datasets), len(heads), squeeze=False))
    colours = _colours(len(pools))
    for row, dataset in enumerate(datasets):
        for column, head in enumerate(heads):
            panel = axes[row, column]
            for pool, colour in zip(pools, colours, strict=True):
                cell = next((c for c in summary if (c["dataset"], c["pool"], c["head"]) ==
                             (dataset, pool, head)), None)
                if cell is not None:
                    curve = cell["curves"][mode]
                    panel.plot(curve["shift"], [100 * v for v in curve["agreement"]],
                               marker=".", color=colour, label=pool)
                    stride = cell["stride"]
            panel.axvline(2, color="grey", lw=0.8, ls=":")
            panel.axvline(stride, color="grey", lw=0.8, ls="--")
            panel.set(title=f"{dataset}, {head} head", ylim=(0, 102),
                      xlabel="shift (pixels)" if row == len(datasets) - 1 else "",
                      ylabel="prediction unchanged (%)" if column == 0 else "")
            panel.grid(alpha=0.3)
    axes[0, -1].legend(fontsize=7, ncol=2, loc="lower left")
    figure.suptitle(f"How often the top-1 prediction survives a shift ({mode} shifts)\n"
                    "dotted: the 2-pixel pooling window; dashed: the network's total stride")
    figure.tight_layout()
    return save_png(figure, path, dpi=90)


def plot_scatter(summary: list[dict], path: str) -> str:
    """Accuracy against consistency, a point per cell with its spreads; a panel per
    dataset, a colour per downsampling and a marker per head."""
    datasets = list(dict.fromkeys(c["dataset"] for c in summary))
    pools = list(dict.fromkeys(c["pool"] for c in summary))
    # a marker per head: at most three heads (HEADS), so the markers may be more
    markers = dict(zip(dict.fromkeys(c["head"] for c in summary), "os^", strict=False))
    figure = figure_class("the study's plots", "train")(figsize=(5 * len(datasets), 4.4))
    axes = np.atleast_1d(figure.subplots(1, len(datasets), squeeze=False)[0])
    colours = dict(zip(pools, _colours(len(pools)), strict=True))
    for panel, dataset in zip(axes, datasets, strict=True):
        for cell in (c for c in summary if c["dataset"] == dataset):
            x, y = cell["consistency"], cell["test_accuracy"]
            panel.errorbar(100 * x["mean"], 100 * y["mean"], xerr=100 * x["spread"],
                           yerr=100 * y["spread"], fmt=markers[cell["head"]],
                           color=colours[cell["pool"]], ms=5, lw=0.8)
        panel.set(title=dataset, xlabel="consistency (%)", ylabel="test accuracy (%)")
        panel.grid(alpha=0.3)
    handles = [axes[0].plot([], [], "o", color=colours[p], label=p)[0] for p in pools]
    handles += [axes[0].plot([], [], markers[h], color="black", mfc="none",
                             label=f"{h} head")[0] for h in markers]
    axes[-1].legend(handles=handles, fontsize=7, ncol=2, loc="lower right")
    figure.tight_layout()
    return save_png(figure, path, dpi=90)


def _colours(count: int) -> list:
    from matplotlib import colormaps
    return [colormaps["tab10"](k % 10) for k in range(count)]


def write(out: str, records: list[dict], about: dict) -> dict:
    """Write every file into ``out``; returns their paths."""
    from .findings import findings
    summary = cells(records)
    paths = {name: os.path.join(out, file) for name, file in FILES.items()}
    result = {"about": about, "cells": summary, "runs": records}
    texts = {"results": json.dumps(result, indent=1, allow_nan=False),
             "table": table(summary), "findings": findings(summary)}
    for name, text in texts.items():
        write_atomically(paths[name], lambda stream, text=text: stream.write(text.encode()))
    for mode in ("zero", "circular"):
        plot_curves(summary, mode, paths[mode])
    plot_scatter(summary, paths["scatter"])
    return paths
