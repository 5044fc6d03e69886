"""The server's counters, written in Prometheus' text exposition format (version 0.0.4).

    aiayn_requests_total{status="200"}      counter: requests answered, by HTTP status
    aiayn_batch_size_bucket{le="8"}         histogram: sentences per batch
    aiayn_queue_depth                       gauge: sentences waiting for a batch
    aiayn_request_seconds_bucket{le="0.1"}  histogram: request latency, arrival to answer

A handful of series do not need a client library: `ServerMetrics.exposition()`
writes them as https://prometheus.io/docs/instrumenting/exposition_formats/ says.
Updated from the event loop and the inference thread, hence the lock.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """Observations counted into cumulative `le` buckets, with their sum and count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def lines(self, name: str) -> list[str]:
        out, cumulative = [], 0
        for bound, count in zip((*self.bounds, "+Inf"), self.counts, strict=True):
            cumulative += count
            out.append(f'{name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        return [*out, f"{name}_sum {_number(self.total)}", f"{name}_count {cumulative}"]


class ServerMetrics:
    """What `GET /metrics` reports.

    Args:
        queue_depth: reads the current number of waiting sentences.
    """

    def __init__(self, queue_depth: Callable[[], int]) -> None:
        self.queue_depth = queue_depth
        self._lock = threading.Lock()
        self.requests: Counter[int] = Counter()
        self.batch_sizes = Histogram(BATCH_SIZE_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)

    def request(self, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[status] += 1
            self.latency.observe(seconds)

    def batch(self, size: int) -> None:
        with self._lock:
            self.batch_sizes.observe(size)

    def exposition(self) -> str:
        with self._lock:
            requests = [
                f'aiayn_requests_total{{status="{status}"}} {n}'
                for status, n in sorted(self.requests.items())
            ]
            batches = self.batch_sizes.lines("aiayn_batch_size")
            latency = self.latency.lines("aiayn_request_seconds")
        blocks = [
            ("aiayn_requests_total", "counter", "Requests answered, by HTTP status.", requests),
            ("aiayn_batch_size", "histogram", "Sentences per decoded batch.", batches),
            (
                "aiayn_queue_depth",
                "gauge",
                "Sentences waiting for a batch.",
                [f"aiayn_queue_depth {self.queue_depth()}"],
            ),
            (
                "aiayn_request_seconds",
                "histogram",
                "Request latency from arrival to answer, seconds.",
                latency,
            ),
        ]
        lines = []
        for name, kind, help_text, samples in blocks:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"


def _number(value: float | str) -> str:
    return value if isinstance(value, str) else repr(float(value))
