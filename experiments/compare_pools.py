"""Compare the downsampling layers of `poolgrad train` on digits and MNIST-1D.

    python experiments/compare_pools.py            # writes experiments/results.json

Each run is `poolgrad train --dataset D --pool P` with the dataset's defaults (seed 0),
so any row can be reproduced alone from the command line. Prints a Markdown table (the
one in the README).
"""

import json
import os
import platform
import sys
import tempfile

from poolgrad import datasets, train
from poolgrad._files import write_atomically

DATASETS = ("digits", "mnist1d")
POOLS = train.POOLS


def main(out: str = os.path.join(os.path.dirname(__file__), "results.json")) -> None:
    rows = []
    for name in DATASETS:
        data = datasets.load(name)
        for pool in POOLS:
            with tempfile.TemporaryDirectory() as folder:
                metrics = train.train(name, folder, pool=pool, progress=False, data=data,
                                      plot=False)
            rows.append({"dataset": name, "pool": pool,
                         "test_accuracy": metrics["test_accuracy"],
                         "train_time_s": metrics["train_time_s"],
                         "epochs": metrics["settings"]["epochs"]})
            print(f"{name:8} {pool:13} {metrics['test_accuracy']:7.2%} "
                  f"{metrics['train_time_s']:6.1f} s", file=sys.stderr, flush=True)
    result = {"machine": {"cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count()}, "rows": rows}
    write_atomically(out, lambda stream: stream.write(json.dumps(result, indent=2).encode()))
    print("| dataset | downsampling | epochs | test accuracy | training time |")
    print("|---|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['dataset']} | {row['pool']} | {row['epochs']} | "
              f"{row['test_accuracy']:.2%} | {row['train_time_s']:.1f} s |")


if __name__ == "__main__":
    main(*sys.argv[1:])
