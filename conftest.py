"""Doctests in poolgrad/ see NumPy as ``np``."""

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _doctest_numpy(doctest_namespace):
    doctest_namespace["np"] = np
