"""The Kubernetes API client the controller uses: kubernetes_asyncio's, with a timeout on every request.

kubernetes_asyncio sends a request without ``_request_timeout`` with ``aiohttp.ClientTimeout()``, i.e. no timeout
at all: with the apiserver black-holed a tick hung for 40 s+, writing long after its Lease had passed to another
replica. Here every call that does not name its own timeout gets ``request_timeout_s``, which
:func:`request_timeout_for` derives from the election settings: shorter than ``lease_duration - renew_deadline``,
the time between the moment a leader stops leading (its renew deadline) and the earliest moment a follower may
acquire (the lease duration after the last renew). So a write sent just before the deadline has finished or been
abandoned before anyone else can lead. (The informers' list and watch requests name their own timeouts: a watch is
open for minutes by design, and they only read.)

A read (a GET whose answer is read whole: not the informers' streamed lists and watches, which retry on their own)
the server throttles (429: API Priority and Fairness, max-requests-inflight) or fails transiently (500, 502, 503,
504: an apiserver restarting, an etcd leader change) is asked again, after the server's ``Retry-After``
(:func:`~autoscaler.live.kube.writes.retry_after_s`, the writers' one reading of it) or else a short full-jitter
backoff -- as client-go does for every request, and as the writers here already do for their writes. The read and
its retries end within the one timeout the call has (``request_timeout_s``, or its own): a ``Retry-After`` that
would pass it is not waited for, the error reaches the caller at once. A write is never retried here: its writer
retries it (read again, the ``resourceVersion`` carried, the write gate checked again).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.live.kube.writes import api_error, retry_after_s

log = logging.getLogger(__name__)

SAFETY = 0.8  # of the gap: DNS, TLS and the event loop's own lag come on top of the request itself
# What a read is asked again after: throttled, or a server error that says nothing about the request itself
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
READ_RETRIES = 5  # at most this many more attempts per read (each within the call's one deadline)
READ_BACKOFF_S = 0.1  # first retry's backoff cap without a Retry-After (full jitter, doubling per retry)


def request_timeout_for(lease_duration_s: float, renew_deadline_s: float) -> float:
    """The per-request timeout that keeps a deposed leader's writes inside its own term."""
    gap = lease_duration_s - renew_deadline_s
    if gap <= 0:
        raise ValueError(f"lease_duration_s ({lease_duration_s}) must exceed renew_deadline_s ({renew_deadline_s})")
    return SAFETY * gap


def _retried_read(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """The call (``call_api``'s arguments) is a read this client retries: a GET answered whole (not a stream the
    caller reads itself: an informer's list or watch), awaited (not ``async_req``), with a timeout in seconds."""
    method = kwargs.get("method", args[1] if len(args) > 1 else None)
    timeout = kwargs.get("_request_timeout")
    return (str(method).upper() == "GET" and kwargs.get("_preload_content", True) is not False
            and not kwargs.get("async_req") and isinstance(timeout, int | float) and not isinstance(timeout, bool))


class TimeoutApiClient(ApiClient):
    """``ApiClient`` whose calls default to ``request_timeout_s`` (a call that passes ``_request_timeout`` keeps it)
    and whose reads are asked again on a 429 or a transient 5xx within that timeout (the module's docstring)."""

    def __init__(self, *args: Any, request_timeout_s: float, read_retries: int = READ_RETRIES,
                 rng: random.Random | None = None, **kwargs: Any) -> None:
        if not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s!r}")
        super().__init__(*args, **kwargs)
        self.request_timeout_s = float(request_timeout_s)
        self.read_retries = read_retries
        self._rng = rng or random.Random()

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout_s
        if _retried_read(args, kwargs):
            return self._read(args, dict(kwargs))
        return super().call_api(*args, **kwargs)

    async def _read(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The read, asked again while the server says "later" and the call's deadline allows; each attempt gets
        the time left, so the read as a whole never outlasts the one request it replaces."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(kwargs["_request_timeout"])
        for n in range(self.read_retries + 1):
            try:
                return await super().call_api(*args, **kwargs)
            except ApiException as e:
                wait = self._wait(e, n)
                if wait is None or n == self.read_retries or loop.time() + wait >= deadline:
                    raise
                log.info("read %s: %s, asked again in %.2fs", args[0] if args else "?", api_error(e), wait)
                await asyncio.sleep(wait)
                left = deadline - loop.time()
                if left <= 0:
                    raise  # the sleep overran the deadline: no time left for another attempt
                kwargs["_request_timeout"] = left
        raise AssertionError("unreachable")

    def _wait(self, e: ApiException, n: int) -> float | None:
        """Seconds to wait before asking again after ``e`` (the ``n``-th retry), or None: not worth asking again."""
        if e.status not in RETRIED_STATUSES:
            return None
        told = retry_after_s(getattr(e, "headers", None), e.body)
        return told if told is not None else self._rng.uniform(0.0, READ_BACKOFF_S * 2**n)
