"""A fault-injecting reverse proxy in front of the REAL kube-apiserver, for tests of the client side's recovery.

The apiserver stays the source of truth: every request the proxy does not fail on purpose is forwarded to it
(TLS to the apiserver, verifying its CA) and the answer is passed back, watch streams line by line as they come.
What it adds are the faults a real cluster produces rarely and at the wrong moment -- armed by the test, each
one consumed by the next matching request:

* :meth:`FaultProxy.fail_next` -- answer the next K requests (lists, watches, writes; or only those a predicate
  matches, e.g. the GETs) with HTTP 500 (or another status, e.g. a 429 with its ``Retry-After`` header) and a
  ``Status`` body, without asking the apiserver;
* :meth:`FaultProxy.gone_next_watch` -- the next watch gets "410 Gone": either an ``ERROR`` event with code 410
  as the stream's only line (what the apiserver sends for a compacted resourceVersion) or an HTTP 410;
* :meth:`FaultProxy.cut_next_watch` -- forward N events of the next watch, then drop the connection mid-stream;
* :meth:`FaultProxy.cut_watches` -- drop every open watch connection now;
* :meth:`FaultProxy.pause_watches` / :meth:`FaultProxy.resume_watches` -- drop open watches and hold new watch
  requests until resumed: the client is "disconnected" for as long as the test needs (e.g. to change objects
  it must then notice by re-listing);
* :meth:`FaultProxy.black_hole` -- hold every request matching a predicate without an answer (an apiserver that
  accepts the connection and never replies) until :meth:`FaultProxy.clear_rules`;
* :meth:`FaultProxy.delay` -- forward matching requests only after a delay (a slow apiserver).

It listens on plain HTTP on 127.0.0.1 inside the test's event loop (no certificates to make for the client
side), and passes the client's ``Authorization`` header through, so point a ``kubernetes_asyncio``
``Configuration`` at :attr:`FaultProxy.url` with the real token (see :meth:`FaultProxy.client_configuration`)::

    async with FaultProxy(kube_apiserver.url, ca_file=kube_apiserver.ca_file) as proxy:
        async with ApiClient(proxy.client_configuration(kube_apiserver.token)) as api:
            ...
            proxy.gone_next_watch()

:attr:`FaultProxy.requests` records what it saw (method, path, query, status) for assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

# request headers not forwarded: hop-by-hop ones, Host (the upstream's is set by aiohttp), and Accept-Encoding
# (watch streams must arrive uncompressed to be relayed line by line)
_DROP_REQUEST_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "accept-encoding"}


@dataclass
class SeenRequest:
    method: str
    path: str
    query: dict[str, str]
    status: int | None = None  # what the client got (None while a watch is still streaming)
    fault: str | None = None  # the injected fault, if any
    at: float = field(default_factory=time.time)  # wall clock when the proxy received it
    done_at: float | None = None  # wall clock when the request was forwarded upstream (None: never)
    body: bytes = b""  # what the client sent, as forwarded (empty for a request the proxy answered itself)

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1", "True")


@dataclass(eq=False)  # hashed by identity: kept in a set
class _OpenWatch:
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    injected: asyncio.Queue = field(default_factory=asyncio.Queue)  # lines to send before the next upstream one


def _status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FaultProxy:
    def __init__(self, upstream: str, *, ca_file: str | Path | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self._ca_file = str(ca_file) if ca_file else None
        self.requests: list[SeenRequest] = []
        self._fail_left = 0
        self._fail_status = 500
        self._fail_match: Callable[[SeenRequest], bool] | None = None
        self._fail_headers: dict[str, str] = {}
        self._gone_next: str | None = None  # "event" | "http"
        self._cut_after: int | None = None
        self._watch_gate = asyncio.Event()
        self._watch_gate.set()
        self._open: set[_OpenWatch] = set()
        self._closing = False
        self._holes: list[Callable[[SeenRequest], bool]] = []
        self._delays: list[tuple[Callable[[SeenRequest], bool], float]] = []
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        ssl_context = ssl.create_default_context(cafile=self._ca_file)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up (e.g. a cancelled informer) cancels its relay at once, so
        # open_watches tells whether the client really closed its watch; every handler ends promptly once close()
        # cuts the watches, so aiohttp's 60 s shutdown grace is not needed
        self._runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, shutdown_timeout=2.0)
        await self._runner.setup()
        # bind the socket here, so the port is known without peeking into aiohttp internals
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    async def close(self) -> None:
        self._closing = True
        self._released.set()  # black-holed requests are answered
        self._watch_gate.set()  # held watches wake up, see _closing and leave
        self.cut_watches()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def client_configuration(self, token: str) -> Any:
        """A ``kubernetes_asyncio`` ``Configuration`` that talks to the apiserver through this proxy."""
        from kubernetes_asyncio.client import Configuration

        return Configuration(host=self.url, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"})

    # --- faults ---------------------------------------------------------------------------------------------

    def fail_next(self, count: int, status: int = 500, *, match: Callable[[SeenRequest], bool] | None = None,
                  headers: dict[str, str] | None = None) -> None:
        """Answer the next ``count`` requests (of any kind, or those for which ``match(seen)`` is true; the others
        pass) with ``status``, a Status body and ``headers`` (e.g. ``{"Retry-After": "1"}`` on a 429)."""
        self._fail_left, self._fail_status = count, status
        self._fail_match, self._fail_headers = match, dict(headers or {})

    def gone_next_watch(self, *, as_event: bool = True) -> None:
        """The next watch gets 410 Gone: an ERROR event (``as_event``) or an HTTP 410 response."""
        self._gone_next = "event" if as_event else "http"

    def bookmark_open_watches(self, resource_version: str, kind: str = "ConfigMap", api_version: str = "v1") -> int:
        """Send a BOOKMARK event at ``resource_version`` on every open watch now; returns how many got one.

        The apiserver sends bookmarks only on a best-effort basis (the API promises none), so a test that must see
        one injects it, in exactly the server's shape."""
        event = {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                                                 "metadata": {"resourceVersion": str(resource_version)}}}
        line = json.dumps(event).encode() + b"\n"
        for watch in self._open:
            watch.injected.put_nowait(line)
        return len(self._open)

    def cut_next_watch(self, after_events: int = 0) -> None:
        """Drop the next watch's connection (no clean end) after relaying ``after_events`` event lines."""
        self._cut_after = after_events

    def cut_watches(self) -> int:
        """Drop every open watch connection now; how many there were."""
        for watch in self._open:
            watch.cut.set()
        return len(self._open)

    def pause_watches(self) -> None:
        """Drop open watches and hold new watch requests (not lists) until :meth:`resume_watches`."""
        self._watch_gate.clear()
        self.cut_watches()

    def resume_watches(self) -> None:
        self._watch_gate.set()

    def black_hole(self, match: Callable[[SeenRequest], bool]) -> None:
        """Hold every request for which ``match(seen)`` is true, unanswered, until :meth:`clear_rules` (then they
        get a 503, as a client would after its connection finally broke). The client's own timeout is what ends it."""
        self._released.clear()
        self._holes.append(match)

    def delay(self, match: Callable[[SeenRequest], bool], seconds: float) -> None:
        """Forward each request for which ``match(seen)`` is true only after ``seconds``."""
        self._delays.append((match, seconds))

    def clear_rules(self) -> None:
        """Drop every :meth:`black_hole` and :meth:`delay` rule; held requests are answered 503."""
        self._holes.clear()
        self._delays.clear()
        self._released.set()

    def writes(self, since: float = 0.0) -> list[SeenRequest]:
        """Requests that change the cluster (not GET), forwarded to the apiserver at or after ``since``."""
        return [r for r in self.requests
                if r.method not in ("GET", "HEAD") and r.done_at is not None and r.done_at >= since]

    @property
    def open_watches(self) -> int:
        return len(self._open)

    @property
    def held_watches(self) -> int:
        """Watch requests waiting at the paused gate."""
        return sum(1 for r in self.requests if r.watch and r.status is None and r.fault == "held")

    # --- serving --------------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = SeenRequest(request.method, request.path, dict(request.query))
        self.requests.append(seen)
        if seen.watch and not self._watch_gate.is_set():
            seen.fault = "held"
            await self._watch_gate.wait()
            seen.fault = None
        if any(match(seen) for match in self._holes):
            seen.fault = "black-hole"
            await self._released.wait()
            return self._answer(seen, 503, _status_body(503, "ServiceUnavailable", "black hole released"))
        for match, seconds in list(self._delays):
            if match(seen):
                seen.fault = f"delay-{seconds}"
                await asyncio.sleep(seconds)
        if self._closing:
            return self._answer(seen, 503, _status_body(503, "ServiceUnavailable", "FaultProxy is closing"))
        if self._fail_left > 0 and (self._fail_match is None or self._fail_match(seen)):
            self._fail_left -= 1
            seen.fault = f"http-{self._fail_status}"
            response = self._answer(seen, self._fail_status,
                                    _status_body(self._fail_status, "InternalError", "injected"))
            response.headers.update(self._fail_headers)
            return response
        if seen.watch and self._gone_next is not None:
            form, self._gone_next = self._gone_next, None
            seen.fault = f"gone-{form}"
            status = _status_body(410, "Expired", "too old resource version: injected by FaultProxy")
            if form == "http":
                return self._answer(seen, 410, status)
            # what the apiserver does for a compacted resourceVersion: 200, one ERROR event, end of stream
            return self._answer(seen, 200, {"type": "ERROR", "object": status}, newline=True)

        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST_HEADERS}
        # aiohttp would ask for gzip on its own, and the apiserver compresses large lists (a cluster-wide pods list
        # in a long test session): the body would be relayed still compressed, without its Content-Encoding
        headers["Accept-Encoding"] = "identity"
        body = await request.read()
        seen.done_at, seen.body = time.time(), body
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            if not seen.watch or upstream.status != 200:
                data = await upstream.read()
                return self._answer(seen, upstream.status, data, content_type=upstream.headers.get("Content-Type"))
            return await self._relay_watch(request, upstream, seen)

    def _answer(
        self, seen: SeenRequest, status: int, body: Any, *, content_type: str | None = None, newline: bool = False
    ) -> web.Response:
        seen.status = status
        if not isinstance(body, bytes):
            body = json.dumps(body).encode() + (b"\n" if newline else b"")
            content_type = "application/json"
        headers = {"Content-Type": content_type} if content_type else None
        return web.Response(status=status, body=body, headers=headers)

    async def _relay_watch(
        self, request: web.Request, upstream: aiohttp.ClientResponse, seen: SeenRequest
    ) -> web.StreamResponse:
        cut_after, self._cut_after = self._cut_after, None
        response = web.StreamResponse(
            status=200, headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")}
        )
        await response.prepare(request)
        seen.status = 200
        watch = _OpenWatch()
        self._open.add(watch)
        relayed = 0
        try:
            while True:
                if cut_after is not None and relayed >= cut_after:
                    watch.cut.set()
                if watch.cut.is_set():
                    seen.fault = "cut"
                    # drop the TCP connection without the chunked encoding's last chunk: to the client this is a
                    # connection lost mid-stream, not a watch the server ended
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                line = await self._next_line(upstream, watch)
                if line is None:
                    continue  # cut while waiting: handled at the top
                if not line:
                    break  # the apiserver ended the watch (timeoutSeconds): end ours cleanly too
                await response.write(line)
                relayed += 1
        except (ConnectionResetError, aiohttp.ClientError):
            return response  # the client went away (or the apiserver did): nothing left to relay
        finally:
            self._open.discard(watch)
        await response.write_eof()
        return response

    @staticmethod
    async def _next_line(upstream: aiohttp.ClientResponse, watch: _OpenWatch) -> bytes | None:
        """The next line: an injected one, else the apiserver's; None if the watch is cut first."""
        if not watch.injected.empty():
            return watch.injected.get_nowait()
        read = asyncio.ensure_future(upstream.content.readline())
        cut = asyncio.ensure_future(watch.cut.wait())
        inject = asyncio.ensure_future(watch.injected.get())
        try:
            done, _ = await asyncio.wait({read, cut, inject}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (read, cut, inject):
                if not task.done():
                    task.cancel()  # a pending readline consumed nothing yet: cancelling it loses no data
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        if read in done:
            if inject in done:  # both at once: send the upstream line now, the injected one next
                watch.injected.put_nowait(inject.result())
            return read.result()
        if inject in done:
            return inject.result()
        return None
