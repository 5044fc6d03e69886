"""The server's settings: how it batches, and what one request may ask for."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.apps.serve.batcher import BatchLimits


@dataclass(frozen=True)
class ServeConfig:
    """Settings of `aiayn serve`.

    Attributes:
        queue_size: sentences waiting for a batch at most, all requests together;
            a request that does not fit gets 429.
        max_tokens: source tokens per batch (rows x longest, padding included).
        max_batch: sentences per batch at most (1 = no batching).
        max_wait_ms: how long the model may stay idle while sentences wait for others.
        max_chars: characters per request at most (413 above).
        max_sentences: sentences per request at most (413 above).
        max_request_tokens: source subword tokens per request at most (413 above).
        max_beam: the widest beam a request may ask for (422 above).
        deadline_s: seconds a request may take, queueing included (504 after).
        threads: torch's intra-op threads for the inference thread.
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
    threads: int = 1

    def __post_init__(self) -> None:
        positive = (
            "queue_size max_tokens max_batch max_chars max_sentences max_request_tokens "
            "max_beam threads"
        )
        for name in positive.split():
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {self.deadline_s}")
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
