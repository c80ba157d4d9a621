"""Train the digits CNN (16 and 32 3x3 filters, two 2x downsamplings, linear head)
with each pooling kind of poolgrad.nn: 15 epochs of Adam at 0.003, batch 100, seed 0.

A check that every kind trains end to end until `poolgrad train --pool` has them:
``python experiments/train_kinds.py`` prints each test accuracy and learned parameter
(under a minute on 2 cores).
"""

import time

import numpy as np

from poolgrad import nn, optim
from poolgrad.tools import datasets

data = datasets.digits()
KINDS = {
    "max": lambda: nn.MaxPool(2),
    "max_blur": lambda: nn.MaxBlurPool(2, 2),
    "blur": lambda: nn.BlurPool(2),
    "soft": lambda: nn.SoftPool(2),
    "stochastic": lambda: nn.StochasticPool(2, rng=0),
    "gem": lambda: nn.GeMPool(3.0, kernel_size=2),
    "mixed": lambda: nn.MixedPool(2),
    "gated": lambda: nn.GatedPool(2),
}
for name, make in KINDS.items():
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Conv(1, 16, 3, padding=1, rng=rng), nn.ReLU(), make(),
                          nn.Conv(16, 32, 3, padding=1, rng=rng), nn.ReLU(), make(),
                          nn.Flatten(), nn.Linear(32 * 2 * 2, 10, rng=rng))
    loss_fn, opt = nn.SoftmaxCrossEntropy(), optim.Adam(model.parameters(), lr=3e-3)
    x, y = data.x_train.astype(np.float32), data.y_train
    start = time.perf_counter()
    for epoch in range(15):
        order = np.random.default_rng([0, epoch]).permutation(len(x))
        model.train()
        for i in range(0, len(x), 100):
            b = order[i:i + 100]
            loss_fn.forward(model.forward(x[b]), y[b])
            model.backward(loss_fn.backward())
            opt.step()
    model.eval()
    acc = np.mean(np.argmax(model.forward(data.x_test.astype(np.float32)), 1) == data.y_test)
    extra = {k: v for layer in model.layers for k, v in layer.params.items()
             if k in ("p", "alpha")}
    print(f"{name:11s} test accuracy {acc:.2%}  {time.perf_counter() - start:5.1f} s  {extra}")
