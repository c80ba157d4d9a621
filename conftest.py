"""Doctests in poolgrad/ see NumPy as ``np``; poolgrad.torch's are skipped without torch."""

import importlib.util

import numpy as np
import pytest

# poolgrad.torch cannot be imported (so its doctests not collected) without PyTorch
collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["poolgrad/torch/*"]


@pytest.fixture(autouse=True)
def _doctest_numpy(doctest_namespace):
    doctest_namespace["np"] = np
