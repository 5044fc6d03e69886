"""HTTP/1.1 with a header timeout: uvicorn's h11 protocol, closing a connection whose
request line and headers do not arrive in time.

uvicorn bounds the idle time between requests (`timeout_keep_alive`) and the size of a
request's head (h11's `max_incomplete_event_size`), but not how long the head takes:
a client that sends one header byte now and then (slow loris) holds its connection for
as long as it likes. Here a timer starts when a connection opens and again when an
answer has been sent (a keep-alive connection awaits the next request); it is stopped
once the request's head is whole. When it fires first, the connection is closed (as it
is when a client goes on sending the body of a request already answered). The body's
own time limit is the app's (`ServeConfig.body_timeout_s`).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class HeaderTimeoutProtocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request head is not whole within
    `header_timeout_s` seconds (see the module); subclass it with the value set, as
    `header_timeout_protocol` does."""

    header_timeout_s: float = 10.0

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._answering():
            self._head_arrived()

    def on_response_complete(self) -> None:
        self._await_head()  # before the next request's events, which the call may handle
        super().on_response_complete()

    def _await_head(self) -> None:
        self._head_arrived()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _head_arrived(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _answering(self) -> bool:
        """A request's head is in and its answer is not yet sent: the app owns the time."""
        return self.conn.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)

    def _header_timeout(self) -> None:
        self._header_timer = None
        # not answering: waiting for a head, or for the rest of a body already answered
        if not self._answering() and not self.transport.is_closing():
            log.info(
                "closed a connection whose request head did not arrive within %g s",
                self.header_timeout_s,
            )
            self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's `http=` with a header timeout of `seconds`."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": seconds})
