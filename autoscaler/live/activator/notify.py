"""Activation reports: ``POST /v1/activations`` to every controller endpoint (docs/scale-to-zero.md).

:meth:`Notifier.kick` (the first held request of a model) wakes the loop at once; while anything is held it
reports every ``interval_s``; a model whose last held request just left is reported once more with ``held: 0``.
Endpoints: the ``--controller`` URLs, plus every address ``--controller-service HOST:PORT`` resolves to at each
report (each controller replica gets it: the leader acts, the others keep the counts for when they lead).
A controller that does not answer delays nothing: each POST has its own short timeout and failures are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

log = logging.getLogger("slotwise.activator.notify")

Report = Callable[[], list[dict[str, Any]]]  # the models' entries now (held > 0, and those that just emptied)


class Notifier:
    def __init__(self, session: aiohttp.ClientSession, activator: str, report: Report, *,
                 controllers: Sequence[str] = (), controller_service: str | None = None,
                 interval_s: float = 1.0, timeout_s: float = 1.0) -> None:
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
                await resp.read()
                self.sent += 1
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self.failed += 1
            log.debug("activation report to %s failed: %s", url, e)

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            try:
                await self.send_once()
            except Exception:  # never let the reports die: scale-from-zero depends on them
                log.exception("activation report failed")
