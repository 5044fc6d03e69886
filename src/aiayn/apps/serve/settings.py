"""The server's settings: how it batches, and what one request may ask for."""

from __future__ import annotations

import os
from dataclasses import dataclass

from aiayn.apps.serve.batcher import BatchLimits

MAX_DEADLINE_S = 86_400.0
"""The longest deadline and batching wait taken, a day: a longer one is no deadline,
and timers of much longer ones overflow."""


@dataclass(frozen=True)
class ServeConfig:
    """Settings of `aiayn serve`.

    Attributes:
        queue_size: sentences waiting for a batch at most, all requests together;
            a request that does not fit gets 429.
        max_tokens: source tokens per batch (rows x longest, padding included).
        max_batch: sentences per batch at most (1 = no batching).
        max_wait_ms: how long the model may stay idle while sentences wait for others
            (at most `MAX_DEADLINE_S`).
        max_chars: characters per request at most (413 above).
        max_sentences: sentences per request at most (413 above).
        max_request_tokens: source subword tokens per request at most (413 above).
        max_beam: the widest beam a request may ask for (422 above).
        deadline_s: seconds a request may take, queueing included (504 after), at
            most `MAX_DEADLINE_S`.
        body_timeout_s: seconds a request's body may take to arrive, counted from the
            request's start (408 after, and the connection is closed): a client that
            sends part of its body and stalls holds no connection longer. At most
            `MAX_DEADLINE_S`.
        header_timeout_s: seconds a request's line and headers may take to arrive,
            counted from when the connection opened or its previous answer was sent:
            a client that drips its headers (slow loris) is disconnected then. At most
            `MAX_DEADLINE_S`.
        max_response_bytes: the largest answer with attention maps: a request whose
            maps could take more (`attention_bytes`, from its sentences' lengths and
            their longest translations) gets 413 before it is decoded.
        threads: torch's intra-op threads for the inference thread (at most the
            machine's cores).
        continuous: with N > 0, sentences are decoded N at once by continuous batching
            (`aiayn.apps.serve.batcher.ContinuousBatcher`): each joins the table of
            slots at the next step and leaves it when done; `max_tokens`, `max_batch`
            and `max_wait_ms` are then not used. 0: dynamic batching. One table per
            beam width is kept, at most `max_beam` slots per sentence over all of them
            (`aiayn.apps.serve.engine.ContinuousEngine`).
        compile: with `continuous`, compile the table's decoding step (once per
            beam width, when first asked for).
    """

    queue_size: int = 256
    max_tokens: int = 4096
    max_batch: int = 128
    max_wait_ms: float = 5.0
    max_chars: int = 20_000
    max_sentences: int = 64
    max_request_tokens: int = 4096
    max_beam: int = 16
    deadline_s: float = 30.0
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    max_response_bytes: int = 32 * 2**20
    threads: int = 1
    continuous: int = 0
    compile: bool = False

    def __post_init__(self) -> None:
        positive = (
            "queue_size max_tokens max_batch max_chars max_sentences max_request_tokens "
            "max_beam max_response_bytes threads"
        )
        for name in positive.split():
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.continuous < 0:
            raise ValueError(
                f"continuous must be >= 0 (0: dynamic batching), got {self.continuous}"
            )
        if self.compile and not self.continuous:
            raise ValueError("compile compiles the continuous engine's step: set continuous too")
        for name in ("deadline_s", "body_timeout_s", "header_timeout_s"):
            if not 0 < getattr(self, name) <= MAX_DEADLINE_S:  # nan too
                raise ValueError(
                    f"{name} must lie in (0, {MAX_DEADLINE_S:g}] seconds, got {getattr(self, name)}"
                )
        if not 0 <= self.max_wait_ms <= 1000 * MAX_DEADLINE_S:
            raise ValueError(
                f"max_wait_ms must lie in [0, {1000 * MAX_DEADLINE_S:.0f}], got {self.max_wait_ms}"
            )
        cores = os.cpu_count() or 1
        if self.threads > cores:
            raise ValueError(
                f"threads must lie in [1, {cores}] (this machine's cores), got {self.threads}"
            )
        if self.max_sentences > self.queue_size:
            raise ValueError(
                f"max_sentences ({self.max_sentences}) must not exceed queue_size "
                f"({self.queue_size}): such a request could never be queued"
            )

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: `max_chars` characters, each escaped as JSON
        may (`\\uXXXX`, 6 bytes), plus room for the other fields."""
        return 6 * self.max_chars + 4096

    def batch_limits(self) -> BatchLimits:
        return BatchLimits(
            queue_size=self.queue_size,
            max_tokens=self.max_tokens,
            max_batch=self.max_batch,
            max_wait=self.max_wait_ms / 1000,
        )
