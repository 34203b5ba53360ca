"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's ``leaderelection`` semantics.

Several controller replicas run; exactly one acts. :class:`LeaderElector` competes for one Lease:

* **acquire** when the Lease is absent (create it), released (``holderIdentity`` empty), or expired. Expiry
  is judged, as client-go does, by OUR clock: the record's ``leaseDurationSeconds`` counted from when WE
  last saw the record change, never from the remote ``renewTime`` -- so clock skew between replicas cannot
  make anyone take over early. A freshly started candidate therefore waits one full lease duration.
* **renew** every ``retry_period_s`` while leading. Every write carries the ``resourceVersion`` that was
  read (optimistic concurrency): a 409 means someone else wrote first, so we re-read and decide again.
* **safety**: :attr:`LeaderElector.is_leader` turns False as soon as ``renew_deadline_s`` has passed since
  the last successful renew -- checked against the clock on every read, not only by the loop -- and
  ``renew_deadline_s < lease_duration_s``. The renew's clock reading is taken just BEFORE its write is
  sent, and a follower's observation just AFTER its read returns, so the follower's clock starts no earlier
  than ours: a leader cut off from the apiserver stops acting before anyone else may take over.
* **release** on cancellation or :meth:`LeaderElector.release` (client-go ``ReleaseOnCancel``): stop
  acting first, then write ``holderIdentity: ""`` / ``leaseDurationSeconds: 1`` so a follower takes over at
  its next retry instead of waiting out the lease.
* transient API errors (HTTP errors, connection failures, timeouts) are logged and retried every retry
  period; leadership is still lost at the renew deadline.

The Lease API must be served: :func:`lease_api_missing` (pure, on the controller's one discovery,
:mod:`~autoscaler.live.kube.discovery`) says why not, and :meth:`LeaderElector.require_served` raises
:class:`LeaseApiNotServed` with that reason -- a server without ``coordination.k8s.io/v1`` would otherwise read as
"no Lease yet" forever and the create fail every retry period, leaving every replica a follower without a word.

The decisions are small pure functions (:func:`decide`, :func:`next_spec`, :func:`released_spec`,
:func:`lease_expired`, :func:`leader_valid`) so they are tested without a server; the class is the I/O
around them. Lease objects travel as plain JSON dicts (camelCase), as the API serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client

from autoscaler.live.kube.discovery import COORDINATION, ServedApis

log = logging.getLogger(__name__)

RELEASED_LEASE_SECONDS = 1  # what client-go writes on release: expires at once even for a reader ignoring ""
LEASE_API_VERSION = f"{COORDINATION[0]}/{COORDINATION[1][0]}"  # coordination.k8s.io/v1 (Kubernetes 1.14+)


# --- pure rules ----------------------------------------------------------------------------------------------


def lease_api_missing(apis: ServedApis) -> str | None:
    """Why leader election cannot run on this server (``coordination.k8s.io/v1`` Leases not served), or None.
    Discovery that failed (``apis.discovered`` False: its assumptions) is no evidence either way: None."""
    if not apis.discovered or apis.pick(COORDINATION) is not None:
        return None
    served = apis.groups.get(COORDINATION[0])
    have = f"it serves {COORDINATION[0]} {', '.join(served)} only" if served else f"it does not serve {COORDINATION[0]}"
    return (f"leader election needs Leases ({LEASE_API_VERSION}, Kubernetes 1.14+) and the API server does not "
            f"serve them ({have}); upgrade the cluster, or run a single replica with --dry-run (which takes no Lease)")


def micro_time(wall: float) -> str:
    """A Kubernetes MicroTime: RFC 3339 UTC with exactly 6 fractional digits and ``Z`` (the apiserver rejects
    other shapes, e.g. ``+00:00``)."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_seconds(lease_duration_s: float) -> int:
    """``leaseDurationSeconds`` to advertise: whole seconds, rounded UP so followers never wait less than we
    assume (the safety margin over the renew deadline only grows)."""
    return max(1, math.ceil(lease_duration_s))


@dataclass(frozen=True)
class LeaseRecord:
    """The election-relevant part of a Lease (its spec), plus the resourceVersion to write against."""

    holder: str  # "" when released or never set
    lease_duration_s: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str | None = None

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=(lease.get("metadata") or {}).get("resourceVersion"),
        )

    def content(self) -> tuple[str, int, str | None, str | None, int]:
        """What counts as "the record changed" (client-go compares the record, not the resourceVersion,
        which also moves when e.g. an annotation is edited)."""
        return (self.holder, self.lease_duration_s, self.acquire_time, self.renew_time, self.transitions)


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it holding it
    RENEW = "renew"  # we hold it: renew (keep acquireTime and leaseTransitions)
    ACQUIRE = "acquire"  # released or expired: take it over (leaseTransitions + 1)
    WAIT = "wait"  # someone else holds a valid lease


def lease_expired(observed_at: float, lease_duration_s: float, now: float) -> bool:
    """Whether a record last seen changing at ``observed_at`` (our clock) has expired at ``now`` (our clock)."""
    return now >= observed_at + lease_duration_s


def leader_valid(renewed_at: float | None, renew_deadline_s: float, now: float) -> bool:
    """Whether a leader whose last successful renew was SENT at ``renewed_at`` may still act at ``now``."""
    return renewed_at is not None and now < renewed_at + renew_deadline_s


def decide(record: LeaseRecord | None, identity: str, *, now: float, observed_at: float) -> Action:
    """May ``identity`` acquire or renew, given the current record and when (our clock) we saw it change?

    Own record -> renew (also after a restart under the same identity, as client-go does). Released (empty
    holder) -> acquire at once. Someone else's -> acquire only once it has not changed for its whole
    ``leaseDurationSeconds`` by our clock."""
    if record is None:
        return Action.CREATE
    if record.holder == identity:
        return Action.RENEW
    if not record.holder or lease_expired(observed_at, record.lease_duration_s, now):
        return Action.ACQUIRE
    return Action.WAIT


def next_spec(record: LeaseRecord | None, identity: str, *, wall_now: float, lease_duration_s: float) -> dict:
    """The Lease spec to write when creating (``record`` None), renewing or taking over."""
    now = micro_time(wall_now)
    spec: dict[str, Any] = {
        "holderIdentity": identity,
        "leaseDurationSeconds": lease_seconds(lease_duration_s),
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": 0,
    }
    if record is not None:
        if record.holder == identity:
            spec["acquireTime"] = record.acquire_time or now
            spec["leaseTransitions"] = record.transitions
        else:
            spec["leaseTransitions"] = record.transitions + 1
    return spec


def released_spec(record: LeaseRecord, *, wall_now: float) -> dict:
    """client-go's release: no holder, a 1 s lease, transitions kept (the next holder increments them)."""
    now = micro_time(wall_now)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": RELEASED_LEASE_SECONDS,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": record.transitions,
    }


# --- I/O -------------------------------------------------------------------------------------------------------


class LeaseApiNotServed(ValueError):
    """The API server does not serve the Lease API: leader election cannot start (see :func:`lease_api_missing`)."""


class LeaseApiError(Exception):
    """An unexpected answer from the apiserver about the Lease (transient as far as election goes)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass
class ElectionStats:
    attempts: int = 0
    failures: int = 0  # errors and timeouts
    conflicts: int = 0  # 409s: someone else wrote first
    transitions: int = 0  # times we became leader
    last_error: str | None = None


class LeaderElector:
    """Competes for the Lease ``namespace/name`` as ``identity``; see the module docstring for the rules.

    ``clock`` (monotonic) drives every decision; ``wall_clock`` only stamps ``acquireTime``/``renewTime``
    for humans and other tools."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity (e.g. the pod name)")
        if min(lease_duration_s, renew_deadline_s, retry_period_s) <= 0:
            raise ValueError("lease_duration_s, renew_deadline_s and retry_period_s must be positive")
        if renew_deadline_s >= lease_duration_s:
            raise ValueError(
                f"renew_deadline_s ({renew_deadline_s}) must be less than lease_duration_s ({lease_duration_s}): "
                "a leader cut off from the apiserver must stop acting before another replica may take over"
            )
        if retry_period_s >= renew_deadline_s:
            raise ValueError(
                f"retry_period_s ({retry_period_s}) must be less than renew_deadline_s ({renew_deadline_s}): "
                "otherwise the leader cannot renew before its own deadline"
            )
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._clock = clock
        self._wall = wall_clock
        self._leases = client.CoordinationV1Api(api_client)
        self._leading = False
        self._renewed_at: float | None = None
        self._lease: dict | None = None  # the Lease as last read or written
        self._record: LeaseRecord | None = None
        self._observed_at = -math.inf  # our clock when the record last changed
        self._callbacks: list[Callable[[bool], None]] = []
        self._leading_event = asyncio.Event()
        self._stop = asyncio.Event()
        self._running = False
        self._run_done = asyncio.Event()
        self._failing = False
        self.stats = ElectionStats()

    # --- public --------------------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True while we hold the Lease and the renew deadline has not passed since the last successful renew
        (evaluated now, so it turns False on time even when the loop is stuck on a hung request)."""
        return self._leading and leader_valid(self._renewed_at, self.renew_deadline_s, self._clock())

    @property
    def term(self) -> int:
        """How many times this elector has started leading: a new number for each term (0 before the first).
        A write planned in one term is never made in another (``live/kube/term.py``)."""
        return self.stats.transitions

    @property
    def renewed_at(self) -> float | None:
        """Our clock when the last successful acquire/renew was sent (None before the first)."""
        return self._renewed_at

    @property
    def holder(self) -> str | None:
        """The holder in the record last seen ("" when released; None before the first read)."""
        return None if self._record is None else self._record.holder

    def require_served(self, apis: ServedApis) -> None:
        """Raise :class:`LeaseApiNotServed`, saying why, when ``apis`` (the server's discovery) lacks the Lease
        API; call it before :meth:`run` (whose failures are otherwise retried quietly, as transient)."""
        if (why := lease_api_missing(apis)) is not None:
            raise LeaseApiNotServed(f"lease {self.namespace}/{self.name}: {why}")

    def on_change(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(leading)`` whenever we start or stop leading (from the loop; exceptions are logged)."""
        self._callbacks.append(callback)

    async def wait_leader(self) -> None:
        """Return once :attr:`is_leader` is True."""
        while not self.is_leader:
            if self._leading_event.is_set():
                # leading but past the deadline and the loop has not noticed yet: it will within moments
                await asyncio.sleep(min(0.05, self.retry_period_s))
            else:
                await self._leading_event.wait()

    async def run(self) -> None:
        """Acquire and renew until cancelled or :meth:`release` is called; either way the Lease is released if
        we hold it. Returns normally after :meth:`release`; re-raises a cancellation after releasing."""
        if self._running:
            raise RuntimeError("LeaderElector.run() is already running")
        self._running = True
        self._run_done.clear()
        try:
            while not self._stop.is_set():
                await self._tick()
                if self._stop.is_set():
                    break
                await self._sleep(self._next_delay())
            await self._give_up()
        except asyncio.CancelledError:
            await self._give_up()
            raise
        finally:
            self._running = False
            self._run_done.set()

    async def release(self) -> None:
        """Stop leading and give the Lease up (if held) so a follower takes over at once; the elector does not
        compete again and a running :meth:`run` returns."""
        self._stop.set()
        if self._running:
            await self._run_done.wait()
        else:
            await self._give_up()

    # --- loop --------------------------------------------------------------------------------------------------

    def _next_delay(self) -> float:
        delay = self.retry_period_s
        if self._leading and self._renewed_at is not None:
            # wake at the deadline too, so on_change(False) fires on time while renewals fail
            delay = min(delay, max(0.0, self._renewed_at + self.renew_deadline_s - self._clock()))
        return delay

    async def _sleep(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=delay)

    async def _bounded(self, work: Awaitable[Any], timeout: float) -> tuple[bool, Any]:
        """Run ``work`` for at most ``timeout`` s, stopping early on :meth:`release`.
        -> (finished, result or exception); a cancellation of the caller propagates (after cleaning up)."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            await asyncio.wait({task, stop})
        if not task.done() or task.cancelled():
            return False, None
        exc = task.exception()
        return True, (exc if exc is not None else task.result())

    async def _tick(self) -> None:
        self._check_deadline()
        self.stats.attempts += 1
        timeout = self.renew_deadline_s
        if self._leading and self._renewed_at is not None:
            # a renew that has not come back by the deadline is too late to keep us leading anyway
            timeout = max(0.001, min(timeout, self._renewed_at + self.renew_deadline_s - self._clock()))
        finished, outcome = await self._bounded(self._try_acquire_or_renew(), timeout)
        if self._stop.is_set():
            return
        if not finished:
            self._failed(TimeoutError(f"no answer within {timeout:.2f} s"))
        elif isinstance(outcome, Exception):
            self._failed(outcome)
        elif self._failing:
            self._failing = False
            log.info("lease %s/%s: apiserver reachable again", self.namespace, self.name)
        self._check_deadline()

    def _failed(self, exc: BaseException) -> None:
        self.stats.failures += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        # the first failure of a streak is a warning; repeats every retry period would only flood the log
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "lease %s/%s: acquire/renew failed: %s", self.namespace, self.name, self.stats.last_error)
        self._failing = True

    def _check_deadline(self) -> None:
        if self._leading and not leader_valid(self._renewed_at, self.renew_deadline_s, self._clock()):
            log.warning(
                "lease %s/%s: not renewed within %.1f s: stepping down",
                self.namespace,
                self.name,
                self.renew_deadline_s,
            )
            self._set_leading(False)

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        if leading:
            self.stats.transitions += 1
            self._leading_event.set()
        else:
            self._leading_event.clear()
        log.info(
            "lease %s/%s: %s %s leading", self.namespace, self.name, self.identity, "started" if leading else "stopped"
        )
        for callback in list(self._callbacks):
            try:
                callback(leading)
            except Exception:
                log.exception("leader election on_change callback failed")

    def _observe(self, lease: dict) -> LeaseRecord:
        record = LeaseRecord.from_lease(lease)
        if self._record is None or record.content() != self._record.content():
            self._observed_at = self._clock()  # after the read returned: never earlier than the writer's clock
        self._lease, self._record = lease, record
        return record

    def _renewed(self, sent_at: float) -> None:
        if not leader_valid(sent_at, self.renew_deadline_s, self._clock()):
            return  # came back too late to count; the next tick renews again
        self._renewed_at = sent_at
        self._set_leading(True)

    async def _try_acquire_or_renew(self) -> None:
        for _ in range(2):  # one immediate re-read after a 409: the record changed under us, look again
            lease = await self._read()
            if lease is None:
                body = self._lease_body(
                    None, next_spec(None, self.identity, wall_now=self._wall(), lease_duration_s=self.lease_duration_s)
                )
                sent_at = self._clock()
                status, answer = await self._call(
                    self._leases.create_namespaced_lease(self.namespace, body, _preload_content=False)
                )
            else:
                record = self._observe(lease)
                action = decide(record, self.identity, now=self._clock(), observed_at=self._observed_at)
                if action is Action.WAIT:
                    if self._leading:
                        log.warning("lease %s/%s: now held by %r", self.namespace, self.name, record.holder)
                        self._set_leading(False)
                    return
                spec = next_spec(record, self.identity, wall_now=self._wall(), lease_duration_s=self.lease_duration_s)
                sent_at = self._clock()
                status, answer = await self._call(
                    self._leases.replace_namespaced_lease(
                        self.name, self.namespace, self._lease_body(lease, spec), _preload_content=False
                    )
                )
            if status == 409:  # create: someone created it first; replace: someone wrote first
                self.stats.conflicts += 1
                continue
            self._check_status(status, answer)
            self._observe(answer)
            self._renewed(sent_at)
            return

    async def _give_up(self) -> None:
        """Stop acting, then write the released record if the Lease is (still) ours."""
        self._set_leading(False)
        if self._record is None or self._record.holder != self.identity:
            return
        # bounded: a shutdown must not hang on an unreachable apiserver (the lease then simply expires). Not
        # stoppable by release() (which is what asked for this), hence its own wait rather than _bounded.
        task = asyncio.ensure_future(self._write_release())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.renew_deadline_s)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task not in done or task.cancelled():
            log.warning("lease %s/%s: release timed out; it will expire instead", self.namespace, self.name)
        elif (exc := task.exception()) is not None:
            log.warning("lease %s/%s: release failed (%s); it will expire instead", self.namespace, self.name, exc)

    async def _write_release(self) -> None:
        for _ in range(2):
            record, lease = self._record, self._lease
            if record is None or lease is None or record.holder != self.identity:
                return  # someone else holds it now: nothing of ours to give up
            body = self._lease_body(lease, released_spec(record, wall_now=self._wall()))
            status, answer = await self._call(
                self._leases.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False)
            )
            if status != 409:
                self._check_status(status, answer)
                self._observe(answer)
                log.info("lease %s/%s: released by %s", self.namespace, self.name, self.identity)
                return
            # changed since we looked (e.g. a renew cut short by the stop did land): re-read, release if ours
            self.stats.conflicts += 1
            lease = await self._read()
            if lease is None:
                return
            self._observe(lease)

    # --- HTTP ------------------------------------------------------------------------------------------------

    def _lease_body(self, lease: dict | None, spec: dict) -> dict:
        if lease is None:
            return {
                "apiVersion": LEASE_API_VERSION,
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
        # keep what others put there (labels, annotations); the resourceVersion makes it a conditional write
        return {**lease, "spec": {**(lease.get("spec") or {}), **spec}}

    async def _read(self) -> dict | None:
        status, answer = await self._call(
            self._leases.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        )
        if status == 404:
            return None
        self._check_status(status, answer)
        return answer

    @staticmethod
    async def _call(request: Awaitable[Any]) -> tuple[int, dict]:
        """Send a request made with ``_preload_content=False`` -> (HTTP status, JSON body as a dict)."""
        response = await request
        try:
            raw = await response.read()
        finally:
            response.release()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"message": raw[:200].decode(errors="replace")}
        return response.status, body if isinstance(body, dict) else {"message": str(body)}

    @staticmethod
    def _check_status(status: int, answer: dict) -> None:
        if not 200 <= status < 300:
            raise LeaseApiError(status, str(answer.get("message") or answer)[:300])
