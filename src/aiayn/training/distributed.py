"""Processes under `torchrun`: one code path for one process and for many.

`torchrun --nproc_per_node N` starts N copies of the program and tells each its
place through the environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...).
Without those variables there is one process, rank 0 of 1, and every collective
below is a no-op, so the trainer never branches on "distributed or not".
Backends: gloo on CPU, NCCL on CUDA.

Several machines: one torchrun per machine, `--nnodes N --nproc-per-node P` and a
c10d rendezvous (`--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID`); ranks
are global, and rank 0 alone writes the run directory, which must be one shared folder.
A process that dies closes its connections, so the others fail in their next collective
at once; with `--max-restarts` torchrun then restarts every node and the run resumes
from its latest checkpoint. A peer that stops answering without closing its
connections (a hung or unreachable machine) is given up on after `COLLECTIVE_TIMEOUT`.

Restarts need `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` in torchrun's environment: by
default the workers of every restart share one c10d store with the rendezvous, keys
of the failed attempt included, and the restarted processes can wait on each other
forever (pytorch/pytorch#135712).
`setup` warns when a run with restarts is launched without it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# How long a collective waits for a silent peer; stated here rather than left to the
# backend's default (gloo's and NCCL's differ), and long enough for rank 0's validation
# and checkpoint writes, which the other ranks wait out in their next collective.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class DistEnv:
    """This process's place among the training processes.

    Attributes:
        rank: global index, 0 .. world_size - 1; rank 0 writes files.
        local_rank: index on this machine (selects the GPU).
        world_size: number of processes.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Whether this process writes checkpoints, logs and metrics."""
        return self.rank == 0


def from_environment() -> DistEnv:
    """Read RANK, LOCAL_RANK and WORLD_SIZE as torchrun sets them (defaults: one process).

    Raises:
        ValueError: the variables are not integers or are inconsistent.
    """
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise ValueError(
            "RANK, LOCAL_RANK and WORLD_SIZE must be integers (as torchrun sets them)"
        ) from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= RANK < WORLD_SIZE, got RANK={rank} WORLD_SIZE={world_size}")
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size)


def setup(device: torch.device) -> DistEnv:
    """Join the process group when started by torchrun; return this process's place.

    Uses NCCL for a CUDA `device` and gloo otherwise. A single process joins nothing.
    """
    env = from_environment()
    if env.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=backend, rank=env.rank, world_size=env.world_size, timeout=COLLECTIVE_TIMEOUT
        )
        log.info("rank %d of %d joined the %s process group", env.rank, env.world_size, backend)
        if env.is_main and restarts_share_the_rendezvous_store():
            log.warning(
                "torchrun --max-restarts with the rendezvous store shared: a restart can "
                "hang (pytorch/pytorch#135712); launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
            )
    return env


def restarts_share_the_rendezvous_store() -> bool:
    """Whether torchrun may restart this process while its workers share the c10d store."""
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return shared and os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") not in ("", "0")


def teardown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    """Whether there are other processes to talk to."""
    return dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Sum (or max) of `values` over all processes, elementwise; the values themselves alone."""
    if not active():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return tensor.tolist()


def all_gather_object(obj: Any) -> list[Any]:
    """Every process's `obj`, in rank order (`[obj]` alone)."""
    if not active():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier() -> None:
    """Wait for every process (no-op alone)."""
    if active():
        dist.barrier()
