"""``findings.md``: the seed's claims about pooling and shifts, each checked against a
study's cells (:func:`poolgrad.study.report.cells`). Every sentence is built from the
figures, so a rerun with other numbers says what those numbers say.

Where a statement pools several cells (every head, say), it gives the mean of their
means and the root mean square of their spreads; two figures differ *beyond the
spread* when their means are further apart than the sum of their spreads.
"""

from __future__ import annotations

import numpy as np

UNTRANSLATED, TRANSLATED = "digits16", "digits16-translated"


class Cells:
    """A study's cells by (dataset, pool, head), and figures pooled over a choice of them."""

    def __init__(self, summary: list[dict]):
        self.index = {(c["dataset"], c["pool"], c["head"]): c for c in summary}
        self.datasets = list(dict.fromkeys(c["dataset"] for c in summary))
        self.pools = list(dict.fromkeys(c["pool"] for c in summary))
        self.heads = list(dict.fromkeys(c["head"] for c in summary))

    def figure(self, metric: str, datasets=None, pools=None, heads=None):
        """(mean, spread) of ``metric`` over the chosen cells, None when there is none."""
        chosen = [c for (d, p, h), c in self.index.items()
                  if (datasets is None or d in datasets) and (pools is None or p in pools)
                  and (heads is None or h in heads)]
        if not chosen:
            return None
        means = [c[metric]["mean"] for c in chosen]
        spreads = [c[metric]["spread"] for c in chosen]
        return float(np.mean(means)), float(np.sqrt(np.mean(np.square(spreads))))

    def agreement(self, dataset: str, shift: int, heads=None, pools=None):
        """The mean agreement at ``shift`` (the dataset's own shift mode) over cells."""
        values = [c["curves"][c["mode"]]["agreement"][shift]
                  for (d, p, h), c in self.index.items() if d == dataset
                  and (heads is None or h in heads) and (pools is None or p in pools)
                  and shift < len(c["curves"][c["mode"]]["agreement"])]
        return float(np.mean(values)) if values else None


def _pct(figure) -> str:
    mean, spread = figure
    return f"{100 * mean:.1f}% ± {100 * spread:.1f}"


def _beyond(a, b) -> bool:
    return abs(a[0] - b[0]) > a[1] + b[1]


def _change(new, old) -> str:
    """``new`` against ``old``: the change in points, and whether it is beyond the spread."""
    delta = 100 * (new[0] - old[0])
    where = "beyond the spread" if _beyond(new, old) else "within the spread"
    return f"{delta:+.1f} points ({where})"


def _local(cells: Cells) -> list[str]:
    lines = ["## 1. \"A shift smaller than the window leaves max pooling's output "
             "unchanged\"", ""]
    if "max" not in cells.pools:
        return lines + ["Not measured: the study has no max pooling.", ""]
    kept = []
    for dataset in cells.datasets:
        one = cells.figure("layer_1px", [dataset], ["max"])
        two = cells.figure("layer_2px", [dataset], ["max"])
        flip = cells.figure("flip_1px", [dataset], ["max"])
        avg = cells.figure("layer_1px", [dataset], ["avg"])
        kept.append(one[0])
        lines.append(f"- {dataset}: a 1-pixel shift of its input leaves {_pct(one)} of the "
                     f"first max pooling's outputs unchanged"
                     + (f" (average pooling: {_pct(avg)})" if avg else "")
                     + f"; a 2-pixel shift, the window, {_pct(two)}. The networks' top-1 "
                     f"prediction changes for {_pct(flip)} of test inputs under a 1-pixel "
                     "shift.")
    verdict = ("Holds" if min(kept) > 0.95 else
               "Only in part: a shift inside the window keeps a window's output only when "
               "its maximum stays inside it, which happens for "
               f"{100 * min(kept):.0f}-{100 * max(kept):.0f}% of the outputs here, not all")
    return lines + ["", f"**Verdict.** {verdict}.", ""]


def _learned(cells: Cells) -> list[str]:
    lines = ["## 2. \"Across windows, invariance is not achieved by pooling alone: the "
             "network must learn it\"", ""]
    if not {UNTRANSLATED, TRANSLATED} <= set(cells.datasets):
        return lines + [f"Not measured: it needs both {UNTRANSLATED} and {TRANSLATED}.", ""]
    stride = cells.index[next(k for k in cells.index if k[0] == UNTRANSLATED)]["stride"]
    figures = {}
    for dataset in (UNTRANSLATED, TRANSLATED):
        figures[dataset] = cells.figure("consistency", [dataset])
        points = ", ".join(f"{100 * cells.agreement(dataset, s):.0f}% at {s} px"
                           for s in (1, stride // 2, stride, 2 * stride))
        lines.append(f"- {dataset}: consistency {_pct(figures[dataset])} over every "
                     f"downsampling and head; the prediction survives {points}.")
    gain = _change(figures[TRANSLATED], figures[UNTRANSLATED])
    lines.append(f"- Training with translation changes consistency by {gain}.")
    if "gap" in cells.heads:
        at = cells.agreement(UNTRANSLATED, stride, heads=["gap"])
        near = cells.agreement(UNTRANSLATED, stride - 1, heads=["gap"])
        sentence = (f"- Without translation in training, the global-average head keeps "
                    f"{100 * at:.0f}% of predictions at a shift of exactly the total stride "
                    f"({stride} px) and {100 * near:.0f}% at {stride - 1} px")
        if at > near + 0.05:
            sentence += (": a shift by the stride moves every feature by one whole position, "
                         "which an average over positions does not see. That invariance is "
                         "built into the architecture, not learned, and it holds only at "
                         "multiples of the stride")
        lines.append(sentence + ".")
    learned = _beyond(figures[TRANSLATED], figures[UNTRANSLATED]) and (
        figures[TRANSLATED][0] > figures[UNTRANSLATED][0])
    verdict = ("Holds: the pooling layers alone leave the predictions of networks trained "
               "on centred digits sensitive to shifts of a few pixels, and training with "
               "translated examples is what makes them consistent" if learned else
               "Not shown: training with translation did not raise consistency beyond the "
               "spread")
    return lines + ["", f"**Verdict.** {verdict}.", ""]


def _antialiasing(cells: Cells) -> list[str]:
    lines = ["## 3. Does anti-aliasing (a blur before subsampling) help?", ""]
    pairs = [(new, old) for new, old in (("blur", "avg"), ("max-blur", "max"))
             if new in cells.pools and old in cells.pools]
    if not pairs:
        return lines + ["Not measured: it needs blur with avg, or max-blur with max.", ""]
    better = worse = total = 0
    for dataset in cells.datasets:
        for new, old in pairs:
            parts = []
            for metric, name in (("consistency", "consistency"), ("test_accuracy",
                                                                   "accuracy")):
                a = cells.figure(metric, [dataset], [new])
                b = cells.figure(metric, [dataset], [old])
                parts.append(f"{name} {_change(a, b)}")
            lines.append(f"- {dataset}, {new} against {old} (every head): "
                         + "; ".join(parts) + ".")
            for head in cells.heads:
                a = cells.figure("consistency", [dataset], [new], [head])
                b = cells.figure("consistency", [dataset], [old], [head])
                if a and b:
                    total += 1
                    better += _beyond(a, b) and a[0] > b[0]
                    worse += _beyond(a, b) and a[0] < b[0]
    verdict = (f"Of {total} comparisons (dataset x head x pair), the blurred layer is more "
               f"consistent beyond the spread in {better}, less in {worse}, and within the "
               f"spread in {total - better - worse}")
    return lines + ["", f"**Verdict.** {verdict}.", ""]


def _modern(cells: Cells) -> list[str]:
    lines = ["## 4. Strided convolution and an attention readout", ""]
    if "strided-conv" in cells.pools and "max" in cells.pools:
        for dataset in cells.datasets:
            parts = []
            for metric, name in (("consistency", "consistency"), ("test_accuracy",
                                                                   "accuracy")):
                strided = cells.figure(metric, [dataset], ["strided-conv"])
                parts.append(f"{name} {_change(strided, cells.figure(metric, [dataset], ['max']))}")
            lines.append(f"- {dataset}, strided convolution against max pooling (every "
                         "head): " + "; ".join(parts) + ".")
    if "attention" in cells.heads:
        for dataset in cells.datasets:
            parts = []
            for other in ("flatten", "gap"):
                if other in cells.heads:
                    a = cells.figure("consistency", [dataset], heads=["attention"])
                    b = cells.figure("consistency", [dataset], heads=[other])
                    c = cells.figure("test_accuracy", [dataset], heads=["attention"])
                    d = cells.figure("test_accuracy", [dataset], heads=[other])
                    parts.append(f"against {other}: consistency {_change(a, b)}, accuracy "
                                 f"{_change(c, d)}")
            lines.append(f"- {dataset}, the attention head (every downsampling) "
                         + "; ".join(parts) + ".")
    if len(lines) == 2:
        lines.append("Not measured: the study has neither strided-conv with max nor the "
                     "attention head.")
    return lines + [""]


def findings(summary: list[dict]) -> str:
    cells = Cells(summary)
    seeds = sorted({c["seeds"] for c in summary})
    head = ["# What the study's numbers say about pooling and shifts", "",
            f"Cells: {len(summary)} (dataset x downsampling x head), {seeds[0]}"
            + (f"-{seeds[-1]}" if len(seeds) > 1 else "") + " seeds each. Figures are the "
            "mean ± the spread (sample standard deviation) over seeds; pooled figures the "
            "mean of the cells' means ± the root mean square of their spreads. A difference "
            "is *beyond the spread* when the means are further apart than the sum of the "
            "spreads.", ""]
    return "\n".join(head + _local(cells) + _learned(cells) + _antialiasing(cells)
                     + _modern(cells))
