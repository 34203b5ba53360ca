"""Activation reports: ``POST /v1/activations`` to every controller endpoint (docs/scale-to-zero.md).

:meth:`Notifier.kick` (the first held request of a model) wakes the loop at once; while anything is held it
reports every ``interval_s``; a model whose last held request just left is reported once more with ``held: 0``.
Endpoints: the ``--controller`` URLs, plus every address ``--controller-service HOST:PORT`` resolves to at each
report (each controller replica gets it: the leader acts, the others keep the counts for when they lead).
A controller that does not answer delays nothing: each POST has its own short timeout and failures are dropped.
A controller that answers with an error (``403``: this pod's IP is not one it knows as an activator's, e.g. behind
a mesh sidecar or SNAT; ``400``: a contract mismatch) is counted (``slotwise_activator_reports_refused``) and
logged as a warning at most once a minute per controller: a model at zero is woken only by these reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

log = logging.getLogger("slotwise.activator.notify")

REFUSED_LOG_INTERVAL_S = 60.0  # a controller refusing every report is logged once a minute, not every second

Report = Callable[[], list[dict[str, Any]]]  # the models' entries now (held > 0, and those that just emptied)


class Notifier:
    def __init__(self, session: aiohttp.ClientSession, activator: str, report: Report, *,
                 controllers: Sequence[str] = (), controller_service: str | None = None,
                 interval_s: float = 1.0, timeout_s: float = 1.0, refused: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session = session
        self.activator = activator
        self.report = report
        self.controllers = [c.rstrip("/") for c in controllers]
        self.controller_service = controller_service
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._wake = asyncio.Event()
        self.sent = 0  # reports POSTed (any answer)
        self.failed = 0
        self.refused = 0  # of those sent, answered with an error status
        self._on_refused = refused  # the metric's inc
        self.clock = clock
        self._warned: dict[str, float] = {}  # controller URL -> when a refusal was last logged

    def kick(self) -> None:
        self._wake.set()

    async def endpoints(self) -> list[str]:
        urls = list(self.controllers)
        if self.controller_service:
            host, _, port = self.controller_service.rpartition(":")
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
            except OSError as e:
                log.warning("controller service %s does not resolve: %s", self.controller_service, e)
                infos = []
            for addr in sorted({i[4][0] for i in infos}):
                urls.append(f"http://[{addr}]:{port}" if ":" in addr else f"http://{addr}:{port}")
        return urls

    async def send_once(self) -> bool:
        """One report to every endpoint, if there is anything to say; True if something was sent."""
        models = self.report()
        if not models:
            return False
        body = {"activator": self.activator, "models": models}
        urls = await self.endpoints()
        await asyncio.gather(*(self._post(u + "/v1/activations", body) for u in urls))
        return True

    async def _post(self, url: str, body: dict[str, Any]) -> None:
        try:
            async with self.session.post(url, json=body, timeout=self.timeout) as resp:
                text = await resp.read()
                self.sent += 1
                if resp.status >= 400:
                    self._refused(url, resp.status, text)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self.failed += 1
            log.debug("activation report to %s failed: %s", url, e)

    def _refused(self, url: str, status: int, text: bytes) -> None:
        self.refused += 1
        self._on_refused()
        now = self.clock()
        if now - self._warned.get(url, -math.inf) >= REFUSED_LOG_INTERVAL_S:
            self._warned[url] = now
            log.warning("activation report refused by %s: %d %s (models at zero are not woken from this "
                        "activator while it is)", url, status, text.decode(errors="replace").strip()[:200])

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            try:
                await self.send_once()
            except Exception:  # never let the reports die: scale-from-zero depends on them
                log.exception("activation report failed")
