"""Activation reports: ``POST /v1/activations`` to every controller endpoint (docs/scale-to-zero.md).

:meth:`Notifier.kick` (the first held request of a model) wakes the loop at once; while anything is held it
reports every ``interval_s``; a model whose last held request just left is reported once more with ``held: 0``.
Endpoints: the ``--controller`` URLs, plus every address ``--controller-service HOST:PORT`` resolves to at each
report (each controller replica gets it: the leader acts, the others keep the counts for when they lead).
A controller that does not answer delays nothing: each POST has its own short timeout and failures are dropped.
Each report carries this pod's ServiceAccount token as its bearer token (``--token-file``: the chart's projected
token, audience ``slotwise.io/activations``; :class:`TokenFile` re-reads it as the kubelet rotates it): the
controller authenticates it with a TokenReview. A controller that answers with an error (``401``: no or an
invalid token; ``403``: a token that is not the activator's ServiceAccount's, or of a pod that is not an activator
pod; ``400``: a contract mismatch) is counted (``slotwise_activator_reports_refused``) and logged as a warning at
most once a minute per controller: a model at zero is woken only by these reports.
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
TOKEN_REREAD_S = 30.0  # the kubelet rotates a projected token at 80 % of its life (>= 10 min): re-read well before


class TokenFile:
    """The bearer token in a file (a projected ServiceAccount token), read again every ``reread_s``: the kubelet
    replaces the file as the token rotates, and an expired token would have every report refused."""

    def __init__(self, path: str, *, reread_s: float = TOKEN_REREAD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.reread_s = reread_s
        self.clock = clock
        self._token: str | None = None
        self._at = -math.inf

    def __call__(self) -> str | None:
        now = self.clock()
        if now - self._at >= self.reread_s:
            try:
                with open(self.path, encoding="utf-8") as f:
                    self._token = f.read().strip() or None
            except OSError as e:  # keep the last token: a rotation in progress must not drop a report
                log.warning("activation token %s unreadable: %s", self.path, e)
            self._at = now
        return self._token


class Notifier:
    def __init__(self, session: aiohttp.ClientSession, activator: str, report: Report, *,
                 controllers: Sequence[str] = (), controller_service: str | None = None,
                 interval_s: float = 1.0, timeout_s: float = 1.0, refused: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 token: Callable[[], str | None] | None = None) -> None:
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
        self.token = token  # the bearer token of the reports (None: none sent, a controller then answers 401)

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
        token = self.token() if self.token is not None else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        urls = await self.endpoints()
        await asyncio.gather(*(self._post(u + "/v1/activations", body, headers) for u in urls))
        return True

    async def _post(self, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        try:
            async with self.session.post(url, json=body, headers=headers or {}, timeout=self.timeout) as resp:
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
