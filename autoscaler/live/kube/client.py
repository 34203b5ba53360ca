"""The Kubernetes API client the controller uses: kubernetes_asyncio's, with a timeout on every request.

kubernetes_asyncio sends a request without ``_request_timeout`` with ``aiohttp.ClientTimeout()``, i.e. no timeout
at all: with the apiserver black-holed a tick hung for 40 s+, writing long after its Lease had passed to another
replica. Here every call that does not name its own timeout gets ``request_timeout_s``, which
:func:`request_timeout_for` derives from the election settings: shorter than ``lease_duration - renew_deadline``,
the time between the moment a leader stops leading (its renew deadline) and the earliest moment a follower may
acquire (the lease duration after the last renew). So a write sent just before the deadline has finished or been
abandoned before anyone else can lead. (The informers' list and watch requests name their own timeouts: a watch is
open for minutes by design, and they only read.)
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient

SAFETY = 0.8  # of the gap: DNS, TLS and the event loop's own lag come on top of the request itself


def request_timeout_for(lease_duration_s: float, renew_deadline_s: float) -> float:
    """The per-request timeout that keeps a deposed leader's writes inside its own term."""
    gap = lease_duration_s - renew_deadline_s
    if gap <= 0:
        raise ValueError(f"lease_duration_s ({lease_duration_s}) must exceed renew_deadline_s ({renew_deadline_s})")
    return SAFETY * gap


class TimeoutApiClient(ApiClient):
    """``ApiClient`` whose calls default to ``request_timeout_s`` (a call that passes ``_request_timeout`` keeps it)."""

    def __init__(self, *args: Any, request_timeout_s: float, **kwargs: Any) -> None:
        if not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s!r}")
        super().__init__(*args, **kwargs)
        self.request_timeout_s = float(request_timeout_s)

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout_s
        return super().call_api(*args, **kwargs)
