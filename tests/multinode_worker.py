"""torchrun's program in tests/e2e/test_multinode.py: `aiayn train ...`, where a rank may die.

Environment (all optional):
    AIAYN_TEST_KILL_RANK, AIAYN_TEST_KILL_AFTER_STEP: in the first attempt only
        (TORCHELASTIC_RESTART_COUNT 0), that global rank SIGKILLs itself once the
        checkpoint of that update is on disk: a node lost mid-run, after a checkpoint.
    AIAYN_TEST_EVENTS: a file where each rank appends one JSON line per start
        ({"attempt", "rank", "resumed_at"}) and one before it kills itself.
"""

from __future__ import annotations

import json
import os
import signal

from aiayn.cli import app
from aiayn.training import distributed
from aiayn.training.trainer import Trainer


def record(**event: object) -> None:
    path = os.environ.get("AIAYN_TEST_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as events:
            events.write(json.dumps(event) + "\n")


def attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def watch_resume() -> None:
    """Record the update each rank starts from (0: a fresh run)."""
    resume = Trainer.resume

    def resume_and_record(self: Trainer) -> bool:
        resumed = resume(self)
        record(attempt=attempt(), rank=self.env.rank, resumed_at=self.state.step)
        return resumed

    Trainer.resume = resume_and_record


def die_after_checkpoint(rank: int, step: int) -> None:
    """Make global `rank` SIGKILL itself right after the checkpoint of update `step`."""
    save = Trainer.save

    def save_then_die(self: Trainer):
        path = save(self)
        if self.state.step == step and attempt() == 0:
            distributed.barrier()  # rank 0 has written the checkpoint
            if self.env.rank == rank:
                record(attempt=attempt(), rank=rank, killed_after=step)
                os.kill(os.getpid(), signal.SIGKILL)
        return path

    Trainer.save = save_then_die


if __name__ == "__main__":
    watch_resume()
    if "AIAYN_TEST_KILL_RANK" in os.environ:
        die_after_checkpoint(
            int(os.environ["AIAYN_TEST_KILL_RANK"]), int(os.environ["AIAYN_TEST_KILL_AFTER_STEP"])
        )
    app(prog_name="aiayn")
