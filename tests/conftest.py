"""Shared test setup: deterministic, single-threaded torch (pytest-xdist runs 2 workers)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
