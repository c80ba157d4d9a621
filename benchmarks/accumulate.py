"""``poolgrad train --accumulate``: how close K batches of B come to one batch of K*B,
and what the accumulation saves in memory, on digits (scikit-learn's, bundled).

    python benchmarks/accumulate.py          # prints both tables (about a minute)

1. Equality: one epoch per optimizer (lr 0.01, seed 0) with batches of 100, and with 4
   batches of 25 per step, in both engines; the largest difference between the two
   runs' weights (their largest weight for scale).
2. Memory: the NumPy engine's peak of NumPy allocations (tracemalloc) while it trains
   one epoch with the README's network (widths 16, 32), evaluation left out: a step of
   1400 examples as one batch, as 4 of 350 and as 14 of 100. Each run in a fresh
   process, so that one run's peak does not hide another's.
"""

import subprocess
import sys
import tempfile

import numpy as np

from poolgrad import train
from poolgrad.tools import datasets
from poolgrad.train import checkpoints

MEMORY_RUN = """
import sys, tempfile, tracemalloc
from poolgrad import train
from poolgrad.tools import datasets
from poolgrad.train import numpy_engine
batch, accumulate = int(sys.argv[1]), int(sys.argv[2])
data = datasets.load("digits")
peaks, evaluate = [], numpy_engine.evaluate
def evaluate_apart(*args, **kwargs):  # the training's peak so far, then evaluate
    peaks.append(tracemalloc.get_traced_memory()[1])
    return evaluate(*args, **kwargs)
numpy_engine.evaluate = evaluate_apart
with tempfile.TemporaryDirectory() as folder:
    tracemalloc.start()
    train.train(train.TrainConfig("digits", folder + "/run", epochs=1, batch_size=batch,
                                  accumulate=accumulate, progress=False, plot=False,
                                  data=data))
print(peaks[0] / 2**20)
"""


def weights(engine, folder):
    path = f"{folder}/{checkpoints.CHECKPOINTS[engine]}"
    if engine == "numpy":
        return checkpoints.load_numpy(path)[0]
    state = checkpoints.load_torch(path)["model"]
    return {key: value.numpy() for key, value in state.items()}


def equality():
    data = datasets.load("digits")
    print("| engine | optimizer | largest weight difference | largest weight |")
    print("|---|---|---:|---:|")
    for engine in ("numpy", "torch"):
        for optimizer in ("sgd", "adagrad", "rmsprop", "adam"):
            found = {}
            with tempfile.TemporaryDirectory() as folder:
                for name, batch, accumulate in (("big", 100, 1), ("accumulated", 25, 4)):
                    config = train.TrainConfig(
                        "digits", f"{folder}/{name}", engine=engine, epochs=1,
                        batch_size=batch, accumulate=accumulate, optimizer=optimizer, lr=0.01,
                        progress=False, plot=False, data=data)
                    train.train(config)
                    found[name] = weights(engine, f"{folder}/{name}")
            difference = max(float(np.abs(found["big"][k] - found["accumulated"][k]).max())
                             for k in found["big"])
            largest = max(float(np.abs(v).max()) for v in found["big"].values())
            print(f"| {engine} | {optimizer} | {difference:.1e} | {largest:.2f} |")


def memory():
    print("\n| step | peak NumPy memory while training (MiB) |")
    print("|---|---:|")
    for batch, accumulate in ((1400, 1), (350, 4), (100, 14)):
        done = subprocess.run([sys.executable, "-c", MEMORY_RUN, str(batch), str(accumulate)],
                              capture_output=True, text=True, check=True)
        print(f"| {accumulate} x {batch} | {float(done.stdout.split()[-1]):.1f} |")


if __name__ == "__main__":
    equality()
    memory()
