"""Test variants for the portability audit (issue 41), loaded into every Python process
of a test run, the test processes and their subprocesses alike, by `tests/conftest.py`
putting this folder first on PYTHONPATH when either variable below is set.

- AIAYN_SEED_SHIFT=k: every seed the code sets (torch.manual_seed, torch.Generator's
  manual_seed, numpy's default_rng and seed, random.seed) is shifted by k, so one test
  that fixes seed 0 runs as seed k: `make audit-seeds` runs the training tests at k = 0, 1, 2.
- AIAYN_TRAIN_LOG=FILE: every optimizer step appends the running test's id (pytest's
  PYTEST_CURRENT_TEST, which subprocesses inherit) to FILE: the list of tests that train.

With neither variable set this module does nothing (and conftest does not load it).
"""

from __future__ import annotations

import os

SHIFT = int(os.environ.get("AIAYN_SEED_SHIFT", "0") or 0)
TRAIN_LOG = os.environ.get("AIAYN_TRAIN_LOG")


def _shift_seeds(shift: int) -> None:
    import random

    import numpy as np
    import torch

    manual_seed = torch.manual_seed
    torch.manual_seed = lambda seed: manual_seed(int(seed) + shift)
    torch.random.manual_seed = torch.manual_seed

    class ShiftedGenerator(torch.Generator):
        def manual_seed(self, seed):
            return super().manual_seed(int(seed) + shift)

    torch.Generator = ShiftedGenerator

    default_rng = np.random.default_rng

    def shifted_rng(seed=None):
        if isinstance(seed, (int, np.integer)):
            return default_rng([shift, int(seed)])
        if isinstance(seed, (list, tuple)):
            return default_rng([shift, *seed])
        return default_rng(seed)

    np.random.default_rng = shifted_rng
    np_seed = np.random.seed
    np.random.seed = lambda seed=None: np_seed(None if seed is None else int(seed) + shift)
    random_seed = random.seed
    random.seed = lambda a=None, version=2: random_seed(None if a is None else f"{shift}:{a}")


def _log_training(path: str) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    logged: set[str] = set()

    def log(optimizer, args, kwargs) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        if test and test not in logged:
            logged.add(test)
            with open(path, "a", encoding="utf-8") as out:
                out.write(test + "\n")

    register_optimizer_step_post_hook(log)


if SHIFT:
    _shift_seeds(SHIFT)
if TRAIN_LOG:
    _log_training(TRAIN_LOG)
