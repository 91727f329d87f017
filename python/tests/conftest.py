"""Fixtures: a seeded generator, a private kernel cache, and a small Hugging
Face Llama directory (helpers.write_llama)."""
import os
import sys

import numpy as np
import pytest

from helpers import write_llama


@pytest.fixture
def rng():
    seed = int(os.environ.get("KILN_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"test seed: KILN_TEST_SEED={seed}", file=sys.stderr)
    return np.random.default_rng(seed)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A writable kernel cache of the test's own (also $KILN_CACHE)."""
    path = str(tmp_path / "kernels.kiln")
    monkeypatch.setenv("KILN_CACHE", path)
    return path


@pytest.fixture
def llama(tmp_path, rng):
    """(directory, {name: float32 array}) of a 2-layer Llama with F32 weights."""
    return str(tmp_path), write_llama(str(tmp_path), rng)
