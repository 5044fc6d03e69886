"""Dynamic batching: sentences of concurrent requests merged into batches by one thread.

    batcher = Batcher(run_batch, BatchLimits(queue_size=256, max_tokens=2048))
    batcher.start()
    ticket = batcher.submit([Sentence("A house.", ids)], options, deadline)
    ticket.future.result()            # -> one result per sentence, in order
    batcher.close()                   # finishes what is queued, then stops

Requests put their sentences in one bounded queue (`QueueFull` when it has no
room: the caller answers 429). One inference thread owns the model and runs
`run_batch(options, sentences)`; it is the only caller, so the model, its caches
and torch's thread count need no lock. The thread builds each batch thus:

    - it waits up to `max_wait` seconds, counted from when the oldest waiting
      sentence came or the previous batch ended (whichever is later), unless that
      sentence's group (same options) can fill a batch at once;
    - it takes the oldest sentence and, from its group, the sentences closest to
      it in length while the batch stays within `max_tokens` (rows x longest,
      padding included, as `aiayn.apps.translate` batches) and `max_batch` rows; a
      sentence longer than `max_tokens` is a batch of its own;
    - it sorts the batch longest first and runs it.

While a batch runs, new sentences queue up, so under load batches fill by
themselves. `max_wait` bounds how long the model stays idle while sentences wait
for company: on a quiet server it is the most a lone sentence waits; under load,
a longer one lets the clients answered by the last batch join the next one.
Starting from the oldest sentence keeps the queue first-in first-out across
groups; choosing its neighbours by length keeps padding small.

A request whose client left (`Ticket.cancel`) or whose deadline passed loses the
sentences not yet in a batch; a sentence already being decoded finishes, and its
result is dropped.

`ContinuousBatcher` keeps the queue and its rules but empties it otherwise: into a
table of slots (`Stepper`, `aiayn.inference.engine`) that sentences join at every
step and leave as soon as they finish, or as soon as their request is given up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue has no room for a request's sentences; try again later."""


class DeadlineExceeded(Exception):
    """A request's deadline passed before all its sentences were decoded."""


class Stopped(Exception):
    """The batcher is closing (or closed, or its thread failed) and takes no more work."""


class Unservable(Exception):
    """A request's options cannot be served now: what decodes them could not be made
    (e.g. a table of slots too large for the memory left)."""


@dataclass(frozen=True)
class Sentence:
    """One sentence to decode: its text and its source ids (their count is its cost)."""

    text: str
    ids: Sequence[int]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class BatchLimits:
    """How the batcher queues and merges.

    Attributes:
        queue_size: sentences waiting at most (all requests together).
        max_tokens: source tokens per batch, rows x longest (padding included).
        max_batch: sentences per batch at most (1 turns batching off).
        max_wait: seconds the model may stay idle while sentences wait for others.
    """

    queue_size: int = 256
    max_tokens: int = 4096
    max_batch: int = 256
    max_wait: float = 0.005

    def __post_init__(self) -> None:
        for name in ("queue_size", "max_tokens", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"BatchLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_wait < 0:
            raise ValueError(f"BatchLimits.max_wait must be >= 0 seconds, got {self.max_wait}")


class Ticket:
    """A request in the batcher: `future` gets its list of results, in sentence order.

    The future fails with `DeadlineExceeded` when the deadline passes first, with
    `Unservable` when its options cannot be decoded, with `Stopped` when the inference
    thread failed, or with what `run_batch` raised for one of its sentences.
    """

    def __init__(self, size: int, deadline: float) -> None:
        self.future: Future[list[Any]] = Future()
        self.deadline = deadline
        self.results: list[Any] = [None] * size
        self.remaining = size
        self.cancelled = False

    def cancel(self) -> None:
        """Give up: sentences not yet in a batch are dropped, results are discarded."""
        self.cancelled = True

    @property
    def live(self) -> bool:
        return not self.cancelled and not self.future.done()

    def fail(self, err: Exception) -> None:
        self._settle(self.future.set_exception, err)

    def deliver(self, index: int, result: Any) -> None:
        """Sentence `index`'s result; the last one completes the future."""
        self.results[index] = result
        self.remaining -= 1
        if self.remaining == 0:
            self._settle(self.future.set_result, self.results)

    def _settle(self, setter: Callable[[Any], None], value: Any) -> None:
        # The waiting side may cancel the future (its task was cancelled) at any time.
        with contextlib.suppress(InvalidStateError):
            setter(value)


@dataclass
class _Waiting:
    """A queued sentence: which request and which of its sentences, and when it came."""

    sentence: Sentence
    options: Hashable
    ticket: Ticket
    index: int
    arrived: float = field(default_factory=time.monotonic)


RunBatch = Callable[[Hashable, list[Sentence]], list[Any]]


class Batcher:
    """The bounded queue and the inference thread that empties it in batches.

    Args:
        run_batch: `run_batch(options, sentences) -> results` (one per sentence, in
            order); called only from the inference thread.
        limits: the queue size, token budget, batch size and wait.
        on_batch: called with each batch's size (for metrics), on the inference thread.
        on_start: called first thing on the inference thread (e.g. to set torch's
            thread count there).

    Attributes:
        failure: what ended the inference thread, if anything did (it never should:
            a failing batch fails its own requests); the batcher then takes no work.
        on_fatal: called on the inference thread after such a failure (the server
            sets it to stop, so that the process exits non-zero and is restarted).
    """

    def __init__(
        self,
        run_batch: RunBatch,
        limits: BatchLimits,
        on_batch: Callable[[int], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.run_batch, self.limits = run_batch, limits
        self.on_batch, self.on_start = on_batch, on_start
        self._waiting: list[_Waiting] = []  # arrival order
        self._changed = threading.Condition()
        self._closing = False
        self._free_since = 0.0  # monotonic time the last batch finished
        self.failure: BaseException | None = None
        self.on_fatal: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._serve, name="aiayn-inference", daemon=True)

    # ----- request side ----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def depth(self) -> int:
        """Sentences waiting for a batch (those of requests given up excluded)."""
        with self._changed:
            return sum(w.ticket.live for w in self._waiting)

    def submit(self, sentences: Sequence[Sentence], options: Hashable, deadline: float) -> Ticket:
        """Queue a request's sentences, all decoded with `options` (a hashable key).

        Args:
            sentences: at least one.
            options: passed to `run_batch`; only sentences with equal options share
                a batch.
            deadline: `time.monotonic()` after which the request is given up.

        Sentences submitted before `start` wait for it.

        Raises:
            QueueFull: if the queue has no room for all of them (none is queued).
            Stopped: if the batcher is closing.
        """
        if not sentences:
            raise ValueError("submit needs at least one sentence")
        ticket = Ticket(len(sentences), deadline)
        with self._changed:
            if self.failure is not None:
                raise Stopped(self._failed())
            if self._closing:
                raise Stopped("the server is shutting down")
            room = self.limits.queue_size - len(self._waiting)
            if len(sentences) > room:
                raise QueueFull(
                    f"the queue holds {len(self._waiting)} of {self.limits.queue_size} "
                    f"sentences; this request has {len(sentences)}"
                )
            now = time.monotonic()
            self._waiting += [_Waiting(s, options, ticket, i, now) for i, s in enumerate(sentences)]
            self._changed.notify()
        return ticket

    def close(self, timeout: float | None = None) -> None:
        """Stop taking work, decode everything queued, then stop the thread."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ----- inference thread ---------------------------------------------------------

    def _serve(self) -> None:
        """The inference thread: `_loop`. Should that ever end by an exception, the
        batcher takes no more work (`failure`), fails the requests it holds, and calls
        `on_fatal`."""
        try:
            self._loop()
        except BaseException as err:
            log.critical("the inference thread stopped", exc_info=True)
            with self._changed:
                self.failure = err
                self._closing = True
                self._abandon(Stopped(self._failed()))
            if self.on_fatal is not None:
                self.on_fatal()

    def _failed(self) -> str:
        return f"the inference thread stopped ({type(self.failure).__name__}: {self.failure})"

    def _abandon(self, err: Exception) -> None:
        """Fail every request held (the thread has stopped). Holds the lock."""
        for w in self._waiting:
            w.ticket.fail(err)
        self._waiting = []

    def _loop(self) -> None:
        if self.on_start is not None:
            self.on_start()
        while True:
            with self._changed:
                batch = self._next_batch()
            if batch is None:
                return
            if batch:
                self._run(batch)
                self._free_since = time.monotonic()

    def _next_batch(self) -> list[_Waiting] | None:
        """Wait for and take the next batch ([] if all it found was dropped work);
        None once closing with nothing left. Called holding the lock."""
        while True:
            self._drop_dead()
            if not self._waiting:
                if self._closing:
                    return None
                self._changed.wait()
                continue
            oldest = self._waiting[0]
            batch = self._around(oldest)
            full = len(batch) < sum(w.options == oldest.options for w in self._waiting)
            due = max(oldest.arrived, self._free_since) + self.limits.max_wait
            wait = due - time.monotonic()
            if full or self._closing or len(batch) == self.limits.max_batch or wait <= 0:
                taken = {id(w) for w in batch}
                self._waiting = [w for w in self._waiting if id(w) not in taken]
                return sorted(batch, key=lambda w: -len(w.sentence))
            self._changed.wait(timeout=wait)

    def _around(self, oldest: _Waiting) -> list[_Waiting]:
        """The oldest sentence and, of its group, those nearest it in length that fit."""
        group = [w for w in self._waiting[1:] if w.options == oldest.options]
        group.sort(key=lambda w: abs(len(w.sentence) - len(oldest.sentence)))  # stable: FIFO ties
        batch, width = [oldest], len(oldest.sentence)
        for w in group:
            if len(batch) == self.limits.max_batch:
                break
            wider = max(width, len(w.sentence))
            if (len(batch) + 1) * wider <= self.limits.max_tokens:
                batch.append(w)
                width = wider
        return batch

    def _drop_dead(self) -> None:
        """Remove sentences of cancelled requests, failing those past their deadline."""
        now = time.monotonic()
        for w in self._waiting:
            if w.ticket.live and now > w.ticket.deadline:
                w.ticket.fail(DeadlineExceeded("the request's deadline passed"))
        self._waiting = [w for w in self._waiting if w.ticket.live]

    def _run(self, batch: list[_Waiting]) -> None:
        try:
            if self.on_batch is not None:
                self.on_batch(len(batch))
            results = self.run_batch(batch[0].options, [w.sentence for w in batch])
        except Exception as err:  # one bad batch fails its requests, not the server
            log.exception("a batch of %d sentences failed", len(batch))
            for w in batch:
                if w.ticket.live:
                    w.ticket.fail(err)
            return
        for w, result in zip(batch, results, strict=True):
            if w.ticket.live:
                w.ticket.deliver(w.index, result)


# ----- continuous batching: sentences join and leave at every step --------------------


class Stepper(Protocol):
    """What `ContinuousBatcher` runs: a table that sentences join and leave at every
    step (`aiayn.apps.serve.engine.TranslationEngine` over `aiayn.inference.engine`).
    Called only from the inference thread."""

    def room(self, options: Hashable) -> int:
        """Sentences with `options` that can join now (0 while others' options run)."""
        ...

    def join(self, options: Hashable, sentence: Sentence) -> Hashable:
        """Queue a sentence for the next step; returns its handle."""
        ...

    def leave(self, handle: Hashable) -> None:
        """Drop a sentence (its slots are freed at once)."""
        ...

    def reset(self) -> None:
        """Forget every sentence after a failed step (the table may be half updated)."""
        ...

    def advance(self) -> list[tuple[Hashable, Any]]:
        """One step of every sentence in the table; (handle, result) of those finished."""
        ...

    @property
    def busy(self) -> bool:
        """Some sentence is in the table."""
        ...


class ContinuousBatcher(Batcher):
    """The bounded queue, emptied into a `Stepper` at every step (continuous batching).

    The queue, its limits (`queue_size`), `submit`, deadlines, cancelling and `close`
    (draining) are `Batcher`'s; `max_tokens`, `max_batch` and `max_wait` are not used:
    the table's size bounds the work, and a sentence joins at the next step rather than
    waiting for company. At every step the inference thread moves the queue's oldest
    sentences into the table, first in first out, while the table has room for their
    options (a sentence of other options waits until the table has drained, and those
    behind it wait too, so that none starves); drops the sentences of requests whose
    client left or whose deadline passed, from the queue and from the table (their
    slots are freed at once); runs one step; and delivers what it finished.

    Args:
        stepper: the table (`Stepper`).
        limits: the queue size (the other limits are not used).
        on_batch: called with the number of sentences that joined, at each step some
            did (for metrics), on the inference thread.
        on_start: called first thing on the inference thread.
    """

    def __init__(
        self,
        stepper: Stepper,
        limits: BatchLimits,
        on_batch: Callable[[int], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(_no_batches, limits, on_batch, on_start)
        self.stepper = stepper
        self._inside: dict[Hashable, _Waiting] = {}  # handle -> the sentence in the table

    def _loop(self) -> None:
        if self.on_start is not None:
            self.on_start()
        while True:
            with self._changed:
                self._drop_dead()
                while not self._waiting and not self._inside:
                    if self._closing:
                        return
                    self._changed.wait()
                    self._drop_dead()
                head = self._waiting[0] if self._waiting else None
            # outside the lock: the first sentence of new options may make a table
            room = 0 if head is None else self._room(head)
            with self._changed:
                joining = self._joining(head, room)
            try:
                self._step(joining)
            except Exception as err:  # a failing step fails the table's requests only
                log.exception("a decoding step with %d sentences failed", len(self._inside))
                self._abandon_table(err)

    def _room(self, head: _Waiting) -> int:
        """Sentences of the head's options that may join now; 0, and the head's request
        failed with `Unservable`, when the table for them cannot be made."""
        try:
            return self.stepper.room(head.options)
        except Exception as err:
            log.exception("no table could be made for a request's options")
            head.ticket.fail(Unservable(f"{type(err).__name__}: {err}"))
            return 0

    def _joining(self, head: _Waiting | None, room: int) -> list[_Waiting]:
        """Take up to `room` of the queue's oldest sentences, while they share the head's
        options (one options at a time). Holds the lock."""
        self._drop_dead()  # the head's request may have failed or left meanwhile
        joining: list[_Waiting] = []
        if head is None:
            return joining
        while self._waiting and len(joining) < room and self._waiting[0].options == head.options:
            joining.append(self._waiting.pop(0))
        return joining

    def _step(self, joining: list[_Waiting]) -> None:
        for w in joining:
            try:
                handle = self.stepper.join(w.options, w.sentence)
            except Exception as err:  # this sentence cannot be decoded: its request fails
                log.exception("a sentence could not join the table")
                w.ticket.fail(err)
                continue
            self._inside[handle] = w
        if joining and self.on_batch is not None:
            self.on_batch(len(joining))
        now = time.monotonic()
        for handle, w in list(self._inside.items()):  # clients gone or out of time
            if w.ticket.live and now > w.ticket.deadline:
                w.ticket.fail(DeadlineExceeded("the request's deadline passed"))
            if not w.ticket.live:
                self._leave(handle)
        if not self.stepper.busy:
            return
        for handle, result in self.stepper.advance():
            w = self._inside.pop(handle)
            if w.ticket.live:
                w.ticket.deliver(w.index, result)

    def _abandon_table(self, err: Exception) -> None:
        """Fail the requests of the sentences in the table, and empty it."""
        for w in self._inside.values():
            if w.ticket.live:
                w.ticket.fail(err)
        self._inside.clear()
        self.stepper.reset()

    def _abandon(self, err: Exception) -> None:
        super()._abandon(err)
        for w in self._inside.values():
            w.ticket.fail(err)
        self._inside.clear()

    def _leave(self, handle: Hashable) -> None:
        self.stepper.leave(handle)
        del self._inside[handle]


def _no_batches(options: Hashable, sentences: list[Sentence]) -> list[Any]:
    raise AssertionError("a ContinuousBatcher runs a Stepper, not batches")
