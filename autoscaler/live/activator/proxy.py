"""The activator's HTTP side: hold requests for models without a ready backend, forward the rest, streaming.

The proxy port is aiohttp's low-level server (no router, no middlewares: every request is the same handler).
A request's model comes from ``X-Slotwise-Model: ns/service``, else its Host (:mod:`routes`); unknown -> 404
naming what was looked for. Its Service port is the one the controller's slice maps to the activator port it
arrived on (one server per listener, :meth:`Activator.proxy_server`); a port the Service has not there -> 404.
No ready backend: the request waits in its model's :class:`~holding.HoldQueue`
(full -> 503 with Retry-After; past ``hold_timeout_s`` -> 504; a client that disconnects is dropped: the server
cancels its handler, ``handler_cancellation=True``), the controller hears of the first one at once
(:class:`~notify.Notifier`). When the EndpointSlice watch brings a ready backend the held requests are released
oldest first and forwarded.

Forwarding is a reverse proxy over one pooled ``ClientSession`` (keep-alive): the request body is streamed to
the backend, the response's status and headers (hop-by-hop ones dropped) are sent, then the body chunk by
chunk as it arrives (server-sent events reach the client token by token). A backend that refuses or resets the
connection before answering is retried once on the next backend in turn (with a request body only if none of
it was sent yet), else 502. Nothing per request is logged.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from autoscaler.live.activator.holding import RETRY_AFTER_MIN_S, HoldQueue
from autoscaler.live.activator.metrics import ActivatorMetrics
from autoscaler.live.activator.routes import Route, RouteTable
from autoscaler.live.kube.objects import ACTIVATOR_PORT

MODEL_HEADER = "X-Slotwise-Model"
HOP_BY_HOP = ("Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "TE",
              "Trailer", "Transfer-Encoding", "Upgrade")
# Connection-level failures before any response byte: the request can go to another backend.
RETRYABLE = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def new_session(connect_timeout_s: float = 5.0) -> aiohttp.ClientSession:
    """The one backend session: unlimited pooled keep-alive connections, bytes passed as they are (no
    decompression, no cookies, no headers of its own), no total timeout (a generation may stream for minutes)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
    )


def _strip(headers: Any) -> CIMultiDict[str]:
    out = CIMultiDict(headers)
    for name in HOP_BY_HOP:
        if name in out:
            del out[name]
    return out


class _Body:
    """The client's body as an async iterator for the backend request, remembering whether any was sent."""

    __slots__ = ("content", "started")

    def __init__(self, content: Any) -> None:
        self.content = content
        self.started = False

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self.content.iter_any():
            self.started = True
            yield chunk


class Activator:
    """The routes, the held queues and the handler. ``on_change`` is the EndpointSlice watch's callback."""

    def __init__(self, table: RouteTable, metrics: ActivatorMetrics, session: aiohttp.ClientSession, *,
                 queue_limit: int = 1000, hold_timeout_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.metrics = metrics
        self.session = session
        self.queue_limit = queue_limit
        self.hold_timeout_s = hold_timeout_s
        self.clock = clock
        self.queues: dict[str, HoldQueue] = {}
        # models whose last held request just left (key -> workload name): reported once with held 0
        self._emptied: dict[str, str] = {}
        self.kick: Callable[[], None] = lambda: None  # the notifier's, set by the caller

    # --- held requests --------------------------------------------------------------------------------------

    def _children(self, route: Route) -> tuple[Any, Any]:
        if route.extra is None or route.extra[2] != route.model:
            route.extra = (self.metrics.held.labels(route.namespace, route.model),
                           self.metrics.forwarded.labels(route.namespace, route.model), route.model)
        return route.extra

    def on_change(self, route: Route) -> None:
        """A fronted Service changed: with a ready backend now, release its held requests (oldest first); gone
        from the table (its slices deleted), answer them 503 at once rather than let them wait for the 504."""
        q = self.queues.get(route.key)
        if q is None:
            return
        if self.table.by_key.get(route.key) is not route:
            del self.queues[route.key]
            if not len(q):
                return
            for fut in q.abandon():
                if not fut.done():
                    fut.set_result(self._gone(route))
        elif not len(q):
            return
        elif route.backends or any(route.by_port.values()):
            # a request for a port still without backends is held again by its handler (same deadline)
            for fut, _at in q.drain(self.clock()):
                if not fut.done():
                    fut.set_result(None)
        else:
            return
        self._children(route)[0].set(0)
        self._emptied[route.key] = route.model

    @staticmethod
    def _gone(route: Route) -> web.Response:
        return web.Response(status=503, headers={"Retry-After": str(RETRY_AFTER_MIN_S)},
                            text=f"{route.key}: no longer fronted by this activator (its Service's EndpointSlices "
                                 "are gone)\n")

    async def _hold(self, route: Route, deadline: float) -> web.Response | None:
        """Wait for a ready backend until ``deadline`` (loop time: one for the whole request, however often its
        backends come and go); None when there is one, else the answer (503 queue full or route gone, 504)."""
        q = self.queues.get(route.key)
        if q is None:
            q = self.queues[route.key] = HoldQueue(self.queue_limit)
        now = self.clock()
        fut = asyncio.get_running_loop().create_future()
        if not q.admit(fut, now):
            self.metrics.queue_full.inc()
            return web.Response(status=503, headers={"Retry-After": str(q.retry_after_s(now))},
                                text=f"{route.key}: {len(q)} requests already held while it starts; retry later\n")
        gauge = self._children(route)[0]
        gauge.set(len(q))
        if len(q) == 1:
            self.kick()
        self._emptied.pop(route.key, None)
        try:
            async with asyncio.timeout_at(deadline):
                answer: web.Response | None = await fut
        except TimeoutError:
            q.discard(fut)
            self.metrics.timeouts.inc()
            return web.Response(status=504, text=f"{route.key}: no ready replica within {self.hold_timeout_s:g} s\n")
        finally:  # released, timed out, or abandoned (the client went away: its handler is cancelled)
            q.discard(fut)
            gauge.set(len(q))
            if not len(q):
                self._emptied[route.key] = route.model
            self.metrics.hold_seconds.observe(self.clock() - now)
        return answer

    def report(self) -> list[dict[str, Any]]:
        """The notifier's models: every one holding requests, and those that just stopped (held 0, once)."""
        now = self.clock()
        out = []
        for key, q in self.queues.items():
            if len(q) or key in self._emptied:
                route = self.table.by_key.get(key)
                ns, svc = key.split("/", 1)
                out.append({"namespace": ns, "service": svc, "model": route.model if route else svc,
                            "held": len(q), "oldest_wait_s": round(q.oldest_wait_s(now), 3)})
        for key, model in self._emptied.items():
            if key not in self.queues:  # a route gone with its queue: its last word
                ns, svc = key.split("/", 1)
                out.append({"namespace": ns, "service": svc, "model": model, "held": 0, "oldest_wait_s": 0.0})
        self._emptied.clear()
        return out

    # --- the handler ----------------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest, port: int = ACTIVATOR_PORT) -> web.StreamResponse:
        """One request that arrived on activator port ``port`` (the slice port kube-proxy sent it to)."""
        headers = request.headers
        header = headers.get(MODEL_HEADER)
        route = self.table.lookup(header, headers.get("Host"))
        if route is None:
            return web.Response(status=404, text=self.table.why_not(header, headers.get("Host")) + "\n")
        if route.backends_at(port) is None:
            return self._no_port(route, port)
        if not route.backends_at(port):
            # one deadline from the first admit: backends that flap must not restart the hold timeout
            deadline = asyncio.get_running_loop().time() + self.hold_timeout_s
            while not route.backends_at(port):
                answer = await self._hold(route, deadline)
                if answer is not None:
                    return answer
                now_route = self.table.by_key.get(route.key)
                if now_route is None:
                    return self._gone(route)
                route = now_route
                if route.backends_at(port) is None:
                    return self._no_port(route, port)
        return await self._forward(request, route, port)

    @staticmethod
    def _no_port(route: Route, port: int) -> web.Response:
        return web.Response(status=404, text=f"{route.key}: no Service port is fronted at activator port {port}\n")

    async def _forward(self, request: web.BaseRequest, route: Route,
                       port: int = ACTIVATOR_PORT) -> web.StreamResponse:
        out_headers = _strip(request.headers)
        body = _Body(request.content) if request.body_exists else None
        upstream = None
        for attempt in range(2):
            backends = route.backends_at(port)
            if not backends:
                break
            route.rr += 1
            url = URL(backends[route.rr % len(backends)] + request.raw_path, encoded=True)
            try:
                upstream = await self.session.request(
                    request.method, url, headers=out_headers, data=body.chunks() if body else None,
                    allow_redirects=False)
                break
            except RETRYABLE:
                if attempt or (body is not None and body.started):
                    break
        if upstream is None:
            return web.Response(status=502, text=f"{route.key}: no backend answered\n")
        try:
            self._children(route)[1].inc()
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=_strip(upstream.headers))
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        finally:
            upstream.release()

    # --- the servers ----------------------------------------------------------------------------------------

    def proxy_server(self, port: int = ACTIVATOR_PORT) -> web.Server:
        """The server of one listener, for requests kube-proxy sends to activator port ``port`` (the slice's port:
        the listener may be bound elsewhere, e.g. in tests)."""
        return web.Server(functools.partial(self.handle, port=port), handler_cancellation=True, access_log=None)


def admin_app(metrics: ActivatorMetrics, ready: Callable[[], tuple[bool, str]]) -> web.Application:
    """``/metrics``, ``/healthz`` (the loop answers), ``/readyz`` (the EndpointSlice informers synced)."""

    async def metrics_route(_r: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_r: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_r: web.Request) -> web.Response:
        ok, why = ready()
        return web.Response(status=200 if ok else 503, text=why + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_route)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
