"""Fewer intra-op threads for the steps of incremental decoding on the CPU.

A decoding step multiplies a few rows (one per sentence or beam) by every weight
matrix: little work per operation, and one OpenMP barrier per operation. Where the
cores are shared with other processes, a barrier often waits a whole scheduler
time slice for a descheduled thread; on the 2-core machine of docs/explanation/results/speed.md, with
other jobs running, the steps of a decode ran 5 to 10 times slower with two
threads than with one. `StepThreads` runs the encoder with the threads torch is
set to and every decoding step with fewer.

torch's thread count is global to the process: do not decode from several Python
threads at once with this wrapper.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.inference.decoding import Decodable, Decoding
from aiayn.inference.decoding import start as start_decoding


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` intra-op threads, then restore the previous count."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class StepThreads:
    """A model for `aiayn.inference.search` whose decoding steps use `threads` intra-op threads.

        hypotheses = beam_search(StepThreads(model, threads=1), src)

    Args:
        model: any `aiayn.inference.decoding.Decodable` (a Transformer, or its frozen form).
        threads: intra-op threads for each decoding step.
    """

    def __init__(self, model: Decodable, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model, self.threads = model, threads
        self.cfg: ModelConfig = model.cfg

    def start(self, src: Tensor, beam: int = 1) -> Decoding:
        # The encoder (inside start) runs with the threads torch is set to.
        return _FewerThreadsDecoding(start_decoding(self.model, src, beam), self.threads)


class _FewerThreadsDecoding:
    """A `Decoding` whose steps run with `threads` intra-op threads."""

    def __init__(self, decoding: Decoding, threads: int) -> None:
        self.decoding, self.threads = decoding, threads
        self.input_lengths, self.dtype = decoding.input_lengths, decoding.dtype

    def step(self, last: Tensor) -> Tensor:
        with intra_op_threads(self.threads):
            return self.decoding.step(last)

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.decoding.keep(rows, sentences)
