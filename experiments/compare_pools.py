"""Compare the downsampling layers and heads of `poolgrad train` on digits and MNIST-1D,
in both engines.

    python experiments/compare_pools.py            # writes experiments/results.json

Each run is `poolgrad train --dataset D --engine E --pool P [--head H]` with the
dataset's defaults (seed 0), so any row can be reproduced alone from the command line:
every pool with the flatten head, then max pooling with the gap and attention heads.
Prints a Markdown table (the one in docs/training.md).
"""

import json
import os
import platform
import sys
import tempfile

from poolgrad import train
from poolgrad.tools import datasets
from poolgrad.tools.files import write_atomically

DATASETS = ("digits", "mnist1d")
ENGINES = ("numpy", "torch")
RUNS = [(pool, "flatten") for pool in train.POOLS] + [("max", "gap"), ("max", "attention")]


def main(out: str = os.path.join(os.path.dirname(__file__), "results.json")) -> None:
    rows = []
    for name in DATASETS:
        data = datasets.load(name)
        for engine in ENGINES:
            for pool, head in RUNS:
                with tempfile.TemporaryDirectory() as folder:
                    metrics = train.train(train.TrainConfig(
                        name, folder, engine=engine, pool=pool, head=head, progress=False,
                        plot=False, data=data))
                rows.append({"dataset": name, "engine": engine, "pool": pool, "head": head,
                             "test_accuracy": metrics["test_accuracy"],
                             "train_time_s": metrics["train_time_s"],
                             "epochs": metrics["settings"]["epochs"]})
                print(f"{name:8} {engine:6} {pool:13} {head:9} "
                      f"{metrics['test_accuracy']:7.2%} {metrics['train_time_s']:6.1f} s",
                      file=sys.stderr, flush=True)
    result = {"machine": {"cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count()}, "rows": rows}
    write_atomically(out, lambda stream: stream.write(json.dumps(result, indent=2).encode()))
    print("| dataset | downsampling | head | epochs | numpy: test accuracy, training time "
          "| torch: test accuracy, training time |")
    print("|---|---|---|---:|---:|---:|")
    for row in rows:
        if row["engine"] != "numpy":
            continue
        other = next(r for r in rows if r["engine"] == "torch" and all(
            r[key] == row[key] for key in ("dataset", "pool", "head")))
        print(f"| {row['dataset']} | {row['pool']} | {row['head']} | {row['epochs']} | "
              f"{row['test_accuracy']:.2%}, {row['train_time_s']:.1f} s | "
              f"{other['test_accuracy']:.2%}, {other['train_time_s']:.1f} s |")


if __name__ == "__main__":
    main(*sys.argv[1:])
