"""The control loop's liveness and readiness, and the HTTP server of the controller's observability.

:class:`Health` is the loop's heartbeat and readiness bookkeeping. :func:`start_http` serves ``/metrics`` (the
text exposition format of :class:`~autoscaler.live.exporter.ControllerMetrics`), ``/healthz`` and ``/readyz``
(200, or 503 with the reason as the body) from an aiohttp app; with an
:class:`~autoscaler.live.activations.ActivationBook` also ``POST /v1/activations`` (the activators' reports, issue
18: 202 ``{"leader": bool}``, 400 with the reason for a body that is not the contract's JSON; with a
:class:`~autoscaler.live.activations.ReportAuth` 401/403 for a report without the activator's ServiceAccount token
(checked by a TokenReview; the route shares the metrics port), else -- without one -- 403 from an address that is
not an activator pod's when the controller is told which ones are).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import time
from collections.abc import Callable, Collection

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from autoscaler.live.activations import (
    NOT_THE_SENDER,
    ActivationBook,
    ActivationError,
    Refused,
    ReportAuth,
    parse_report,
)
from autoscaler.live.exporter import ControllerMetrics


class Health:
    """Liveness and readiness of the control loop.

    Alive while the loop beat within ``max_missed_ticks`` ticks of ``tick_s`` (counted from construction
    before the first beat, so a slow start is not a death). Ready once :meth:`set_ready` said so (caches
    synced) AND the loop has run a tick. ``clock`` gives ``now`` when a caller passes none; beat and ask on
    the same clock.
    """

    def __init__(self, tick_s: float, *, max_missed_ticks: int = 3, clock: Callable[[], float] = time.time) -> None:
        if not (tick_s > 0 and math.isfinite(tick_s)):
            raise ValueError(f"tick_s must be positive, got {tick_s!r}")
        self.tick_s = tick_s
        self.max_missed_ticks = max(1, max_missed_ticks)
        self.clock = clock
        self.started_at = clock()
        self.last_beat: float | None = None
        self.beats = 0
        self._ready = False
        self._why_not_ready = "caches not synced yet"

    def beat(self, now: float | None = None) -> None:
        self.last_beat = self.clock() if now is None else now
        self.beats += 1

    def set_ready(self, ready: bool, why: str = "") -> None:
        """``ready``: the caches are synced; else ``why`` not (e.g. "informer pods not synced")."""
        self._ready = ready
        self._why_not_ready = why or "caches not synced"

    def healthz(self, now: float | None = None) -> tuple[bool, str]:
        now = self.clock() if now is None else now
        limit = self.max_missed_ticks * self.tick_s
        since = self.last_beat if self.last_beat is not None else self.started_at
        age = now - since
        if age > limit:
            what = "last tick" if self.last_beat is not None else "start, and no tick yet"
            return False, f"control loop stalled: {age:.1f}s since {what} (limit {limit:.1f}s)"
        if self.last_beat is None:
            return True, f"starting ({age:.1f}s, no tick yet)"
        return True, f"ok: last tick {age:.1f}s ago"

    def readyz(self) -> tuple[bool, str]:
        if not self._ready:
            return False, f"not ready: {self._why_not_ready}"
        if self.beats == 0:
            return False, "not ready: the control loop has not run a tick yet"
        return True, "ok"


log = logging.getLogger("slotwise.health")

def _answer(result: tuple[bool, str]) -> web.Response:
    ok, why = result
    return web.Response(status=200 if ok else 503, text=why + "\n")


def _address(ip: str | None) -> str:
    """``ip`` as one spelling (an IPv4 peer seen on a dual-stack socket as ``::ffff:a.b.c.d`` is ``a.b.c.d``)."""
    try:
        addr = ipaddress.ip_address(ip or "")
    except ValueError:
        return ip or ""
    mapped = getattr(addr, "ipv4_mapped", None)
    return str(mapped or addr)


Allowed = Callable[[], Collection[str]]


REFUSED_LOG_INTERVAL_S = 60.0  # a peer refused every second is logged once a minute


def _activations_route(book: ActivationBook, leading: Callable[[], bool], allowed: Allowed | None,
                       auth: ReportAuth | None = None) -> Callable:
    warned: dict[str, float] = {}

    def warn(peer: str, why: str) -> None:
        now = time.monotonic()
        if now - warned.get(peer, -math.inf) >= REFUSED_LOG_INTERVAL_S:
            warned[peer] = now
            log.warning("activation report from %s refused: %s (see docs/scale-to-zero.md, Security)", peer, why)

    async def activations(request: web.Request) -> web.Response:
        pod: str | None = None  # the pod a pod-bound token names: the report must be that activator's
        if auth is not None:
            peer = _address(request.remote)
            try:
                pod = (await auth.check(request.headers.get("Authorization"), peer)).pod
            except Refused as e:
                warn(peer, e.text)
                headers = {"WWW-Authenticate": 'Bearer realm="slotwise"'} if e.status == 401 else None
                return web.Response(status=e.status, text=e.text + "\n", headers=headers)
        elif allowed is not None:
            peer = _address(request.remote)
            if peer not in {_address(ip) for ip in allowed()}:
                now = time.monotonic()
                if now - warned.get(peer, -math.inf) >= REFUSED_LOG_INTERVAL_S:
                    warned[peer] = now
                    log.warning("activation report from %s refused: not an activator pod's IP (a mesh sidecar or "
                                "SNAT in front of the controller hides the activator's address; see "
                                "docs/scale-to-zero.md, Security)", peer)
                return web.Response(status=403, text=f"activation report refused: {peer} is not an activator pod\n")
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            return web.Response(status=400, text=f"bad activation report: not JSON ({e})\n")
        try:
            if pod is not None and parse_report(body)[0] != pod:
                # one activator's token must not replace another's counts (a report replaces its sender's last)
                text = f"activation report refused: the token is {pod}'s, the report says another activator"
                warn(_address(request.remote), text)
                if auth is not None:  # always, with a pod: only a token review names one
                    auth.count(NOT_THE_SENDER)
                return web.Response(status=403, text=text + "\n")
            book.report(body)
        except ActivationError as e:
            return web.Response(status=400, text=f"bad activation report: {e}\n")
        return web.json_response({"leader": bool(leading())}, status=202)

    return activations


def build_app(metrics: ControllerMetrics, health: Health, activations: ActivationBook | None = None,
              leading: Callable[[], bool] = lambda: False, allowed: Allowed | None = None,
              auth: ReportAuth | None = None) -> web.Application:
    """``auth``: who may ``POST /v1/activations`` (the activator's ServiceAccount token); without it, ``allowed``:
    the addresses it is taken from (the activator pods' IPs; None: any)."""
    async def serve_metrics(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return _answer(health.healthz())

    async def readyz(_request: web.Request) -> web.Response:
        return _answer(health.readyz())

    app = web.Application()
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if activations is not None:
        app.router.add_post("/v1/activations", _activations_route(activations, leading, allowed, auth))
    return app


async def start_http(metrics: ControllerMetrics, health: Health, host: str, port: int,
                     activations: ActivationBook | None = None,
                     leading: Callable[[], bool] = lambda: False, allowed: Allowed | None = None,
                     auth: ReportAuth | None = None) -> web.AppRunner:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` (port 0: any free port; read it
    from the runner's ``addresses``). Stop with ``await runner.cleanup()``."""
    runner = web.AppRunner(build_app(metrics, health, activations, leading, allowed, auth), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port a runner from :func:`start_http` listens on."""
    return int(runner.addresses[0][1])
