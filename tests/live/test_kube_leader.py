"""Leader election (``autoscaler.live.kube.leader``) against a REAL kube-apiserver, plus its pure rules.

* two worker processes (``tests/realparts/leader_worker.py``): exactly one acts; SIGKILL it and the other
  takes over within the lease duration (+ retry periods); SIGTERM it and the release lets the other take over
  at its next retry. Acting intervals never overlap.
* in-process: a leader whose apiserver connection is cut (a TCP forwarder that refuses, or black-holes)
  stops acting at its renew deadline, before anyone may take over, and a second elector acquires only once
  the lease has expired by its own clock.
* the pure decision rules.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from autoscaler.live.kube.discovery import ASSUMED, ServedApis, discover
from autoscaler.live.kube.leader import (
    Action,
    LeaderElector,
    LeaseApiNotServed,
    LeaseRecord,
    decide,
    leader_valid,
    lease_api_missing,
    lease_expired,
    lease_seconds,
    micro_time,
    next_spec,
    released_spec,
)

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

pytest_plugins = ("realparts.kube",)

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "realparts" / "leader_worker.py"
LEASE_S, DEADLINE_S, RETRY_S = 4.0, 3.0, 0.5
SLACK_S = 1.0  # scheduling on a busy 2-core machine, request latency, 50 ms sampling


# --- (d) pure rules -------------------------------------------------------------------------------------------


def record(holder: str = "a", duration: int = 4, transitions: int = 2, renew: str = "r1") -> LeaseRecord:
    return LeaseRecord(holder, duration, "2024-01-01T00:00:00.000000Z", renew, transitions, "7")


def test_micro_time_shape() -> None:
    assert micro_time(0.0) == "1970-01-01T00:00:00.000000Z"
    assert micro_time(1700000000.25) == "2023-11-14T22:13:20.250000Z"


def test_decide_create_renew_wait_acquire() -> None:
    assert decide(None, "a", now=0.0, observed_at=0.0) is Action.CREATE
    assert decide(record("a"), "a", now=100.0, observed_at=0.0) is Action.RENEW
    # someone else's lease: valid until lease duration has passed since WE saw it change
    assert decide(record("b"), "a", now=13.9, observed_at=10.0) is Action.WAIT
    assert decide(record("b"), "a", now=14.0, observed_at=10.0) is Action.ACQUIRE
    # released (empty holder): at once
    assert decide(record(""), "a", now=10.0, observed_at=10.0) is Action.ACQUIRE
    # the record's own duration counts (a released 1 s lease expires after 1 s even with a holder)
    assert decide(record("b", duration=1), "a", now=11.0, observed_at=10.0) is Action.ACQUIRE


def test_expiry_uses_local_observation_not_remote_time() -> None:
    # a renewTime far in the past (skewed clock) does not matter: only when we saw the record change
    skewed = LeaseRecord("b", 4, "1999-01-01T00:00:00.000000Z", "1999-01-01T00:00:00.000000Z", 0)
    assert decide(skewed, "a", now=1000.5, observed_at=1000.0) is Action.WAIT
    assert not lease_expired(1000.0, 4, 1003.99)
    assert lease_expired(1000.0, 4, 1004.0)


def test_leader_valid_deadline() -> None:
    assert not leader_valid(None, 3.0, 0.0)
    assert leader_valid(10.0, 3.0, 12.99)
    assert not leader_valid(10.0, 3.0, 13.0)


def test_next_spec_create_renew_takeover() -> None:
    wall = 1700000000.0
    now = micro_time(wall)
    created = next_spec(None, "a", wall_now=wall, lease_duration_s=4.0)
    assert created == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 4,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": 0,
    }
    renewed = next_spec(record("a", transitions=2), "a", wall_now=wall, lease_duration_s=4.0)
    assert renewed["acquireTime"] == "2024-01-01T00:00:00.000000Z"  # kept
    assert renewed["renewTime"] == now and renewed["leaseTransitions"] == 2
    taken = next_spec(record("b", transitions=2), "a", wall_now=wall, lease_duration_s=4.0)
    assert taken["acquireTime"] == now and taken["leaseTransitions"] == 3 and taken["holderIdentity"] == "a"
    # a fractional duration is advertised rounded UP: followers never wait less than the leader assumes
    assert next_spec(None, "a", wall_now=wall, lease_duration_s=2.2)["leaseDurationSeconds"] == 3
    assert lease_seconds(0.1) == 1


def test_released_spec() -> None:
    spec = released_spec(record("a", transitions=5), wall_now=0.0)
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 5


def test_record_from_lease_and_change() -> None:
    lease = {
        "metadata": {"name": "l", "resourceVersion": "42"},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15, "renewTime": "t", "leaseTransitions": 1},
    }
    rec = LeaseRecord.from_lease(lease)
    assert (rec.holder, rec.lease_duration_s, rec.transitions, rec.resource_version) == ("x", 15, 1, "42")
    assert LeaseRecord.from_lease({"metadata": {}, "spec": {}}).holder == ""
    # only the record counts as a change, not the resourceVersion (an annotation edit moves that too)
    other_rv = LeaseRecord.from_lease({**lease, "metadata": {"resourceVersion": "43"}})
    assert other_rv.content() == rec.content()


def test_timings_are_validated() -> None:
    with pytest.raises(ValueError, match=r"renew_deadline_s .* must be less than lease_duration_s"):
        LeaderElector(None, "ns", "l", "a", lease_duration_s=4, renew_deadline_s=4, retry_period_s=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_period_s"):
        LeaderElector(None, "ns", "l", "a", lease_duration_s=4, renew_deadline_s=2, retry_period_s=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(None, "ns", "l", "", lease_duration_s=4, renew_deadline_s=2, retry_period_s=1)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_server_without_the_lease_api_is_refused_with_the_reason(api: client.ApiClient) -> None:
    elector = LeaderElector(api, "ns", "ctl", "a", lease_duration_s=4, renew_deadline_s=2, retry_period_s=1)
    elector.require_served(ServedApis({"coordination.k8s.io": ("v1", "v1beta1")}))  # served: nothing to say
    elector.require_served(ASSUMED)  # discovery failed: no evidence against, the election runs as before
    for apis, says in ((ServedApis({"": ("v1",), "apps": ("v1",)}), "does not serve coordination.k8s.io"),
                       (ServedApis({"coordination.k8s.io": ("v1beta1",)}), "serves coordination.k8s.io v1beta1 only")):
        assert lease_api_missing(apis) is not None
        with pytest.raises(LeaseApiNotServed, match=r"coordination\.k8s\.io/v1") as e:
            elector.require_served(apis)
        assert says in str(e.value) and "ns/ctl" in str(e.value) and "--dry-run" in str(e.value)
        assert isinstance(e.value, ValueError)  # `slotwise run` prints it as one line, exit 2


@pytest.mark.asyncio
async def test_the_real_server_serves_the_lease_api(api: client.ApiClient) -> None:
    apis = await discover(api)
    assert lease_api_missing(apis) is None
    LeaderElector(api, "ns", "ctl", "a", lease_duration_s=4, renew_deadline_s=2, retry_period_s=1).require_served(apis)


# --- fixtures ----------------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def namespace(api: client.ApiClient) -> str:
    name = f"slotwise-leader-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name  # no controller-manager: a deleted namespace would only sit in Terminating, so it is left


async def read_spec(api: client.ApiClient, namespace: str, name: str) -> dict:
    lease = await client.CoordinationV1Api(api).read_namespaced_lease(name, namespace)
    return api.sanitize_for_serialization(lease)["spec"]


# --- (a), (b) worker processes ----------------------------------------------------------------------------


@contextmanager
def workers(kube: KubeApiserver, namespace: str, lease: str, log: Path, ids: list[str]) -> Iterator[dict]:
    procs: dict[str, subprocess.Popen] = {}
    try:
        for identity in ids:
            args = [
                sys.executable, str(WORKER), "--kubeconfig", str(kube.kubeconfig), "--namespace", namespace,
                "--lease", lease, "--identity", identity, "--log", str(log), "--lease-duration", str(LEASE_S),
                "--renew-deadline", str(DEADLINE_S), "--retry", str(RETRY_S),
            ]  # fmt: skip
            with (log.parent / f"{identity}.out").open("w") as out:
                procs[identity] = subprocess.Popen(
                    args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def events(log: Path) -> list[tuple[str, str, float]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        identity, what, when = line.split()
        out.append((identity, what, float(when)))
    return out


def intervals(evs: list[tuple[str, str, float]], open_end: dict[str, float]) -> list[tuple[float, float, str]]:
    """Acting intervals per identity; one still open ends at ``open_end[identity]`` (e.g. when it was killed)."""
    started: dict[str, float] = {}
    result = []
    for identity, what, when in evs:
        if what == "start":
            assert identity not in started, f"{identity} started twice without stopping"
            started[identity] = when
        else:
            result.append((started.pop(identity), when, identity))
    for identity, start in started.items():
        result.append((start, open_end.get(identity, math.inf), identity))
    return sorted(result)


def assert_no_overlap(spans: list[tuple[float, float, str]]) -> None:
    for (s1, e1, id1), (s2, e2, id2) in itertools.pairwise(spans):
        assert e1 < s2, f"{id1} acted [{s1:.3f}, {e1:.3f}] overlapping {id2} [{s2:.3f}, {e2:.3f}]"


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def first_leader(log: Path, procs: dict[str, subprocess.Popen], timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for identity, what, _ in events(log):
            if what == "start":
                return identity
        for identity, proc in procs.items():
            assert proc.poll() is None, (
                f"worker {identity} exited {proc.returncode}:\n{tail(log.parent / f'{identity}.out')}"
            )
        time.sleep(0.02)
    raise AssertionError(f"no worker started acting within {timeout_s} s")


def wait_start(log: Path, identity: str, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for who, what, when in events(log):
            if who == identity and what == "start":
                return when
        time.sleep(0.02)
    raise AssertionError(
        f"{identity} did not start acting within {timeout_s} s:\n{tail(log.parent / f'{identity}.out')}"
    )


async def settle_one_leader(log: Path, procs: dict[str, subprocess.Popen]) -> tuple[str, str]:
    leader = await asyncio.to_thread(first_leader, log, procs)
    await asyncio.sleep(4 * RETRY_S)  # several retry periods: a second leader would show up by now
    evs = events(log)
    assert [(i, w) for i, w, _ in evs] == [(leader, "start")], evs
    assert all(p.poll() is None for p in procs.values())
    (follower,) = (i for i in procs if i != leader)
    return leader, follower


@pytest.mark.asyncio
async def test_sigkill_leader_follower_takes_over(
    kube_apiserver: KubeApiserver, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "acting.log"
    with workers(kube_apiserver, namespace, "ctl", log, ["w-1", "w-2"]) as procs:
        leader, follower = await settle_one_leader(log, procs)
        assert (await read_spec(api, namespace, "ctl"))["holderIdentity"] == leader

        killed_at = time.time()
        os.killpg(procs[leader].pid, signal.SIGKILL)
        procs[leader].wait(timeout=10)
        dead_at = time.time()  # it cannot have acted after this

        budget = LEASE_S + 2 * RETRY_S + SLACK_S
        took_over = await asyncio.to_thread(wait_start, log, follower, budget + 5)
        print(f"SIGKILL -> follower acting after {took_over - killed_at:.2f} s")
        # the follower sees the last renew at most one retry after it was written (<= the kill), then waits
        # the lease duration counted from that observation, checking every retry period
        assert took_over - killed_at <= budget
        assert_no_overlap(intervals(events(log), {leader: dead_at}))
        spec = await read_spec(api, namespace, "ctl")
        assert spec["holderIdentity"] == follower
        assert spec["leaseTransitions"] == 1
        assert spec["leaseDurationSeconds"] == 4


@pytest.mark.asyncio
async def test_sigterm_releases_follower_takes_over_at_once(
    kube_apiserver: KubeApiserver, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "acting.log"
    with workers(kube_apiserver, namespace, "ctl", log, ["w-1", "w-2"]) as procs:
        leader, follower = await settle_one_leader(log, procs)

        termed_at = time.time()
        os.killpg(procs[leader].pid, signal.SIGTERM)
        took_over = await asyncio.to_thread(wait_start, log, follower, LEASE_S + 5)
        rc = await asyncio.to_thread(procs[leader].wait, 10)
        print(f"SIGTERM -> follower acting after {took_over - termed_at:.2f} s")
        assert rc == 0, tail(tmp_path / f"{leader}.out")
        # released: the follower acquires at its next retry, not after the lease duration
        assert took_over - termed_at < RETRY_S + SLACK_S < LEASE_S
        spans = intervals(events(log), {})
        assert [s[2] for s in spans] == [leader, follower]
        assert_no_overlap(spans)
        spec = await read_spec(api, namespace, "ctl")
        assert spec["holderIdentity"] == follower
        assert spec["leaseTransitions"] == 1


# --- (c) in-process: the leader loses its apiserver ---------------------------------------------------------


class Forwarder:
    """A TCP forwarder in front of the apiserver that can be cut: ``refuse`` (stop listening, drop every
    connection) or ``blackhole`` (keep connections and accept new ones, pass no bytes: requests hang)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.mode = "forward"
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self.mode == "blackhole":
                while await reader.read(65536):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.add(up_writer)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                if self.mode != "forward":
                    continue  # black-holed: swallow
                dst.write(data)
                await dst.drain()
        finally:
            dst.transport.abort()

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def cut(self, mode: str) -> None:
        self.mode = mode
        if mode == "refuse":
            assert self._server is not None
            self._server.close()
            self._abort_all()

    async def restore(self) -> None:
        self._abort_all()  # black-holed connections are mid-stream garbage: make clients reconnect
        if self.mode == "refuse":
            await self.start()
        self.mode = "forward"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._abort_all()


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", ["refuse", "blackhole"])
async def test_cut_off_leader_steps_down_before_takeover(
    kube_apiserver: KubeApiserver, api: client.ApiClient, namespace: str, cut: str
) -> None:
    target = urlsplit(kube_apiserver.url)
    proxy = Forwarder(target.hostname or "127.0.0.1", target.port or 443)
    await proxy.start()
    via_proxy = kube_apiserver.client_configuration()
    via_proxy.host = f"https://127.0.0.1:{proxy.port}"
    timings = dict(lease_duration_s=LEASE_S, renew_deadline_s=DEADLINE_S, retry_period_s=RETRY_S)
    changes: dict[str, list[tuple[bool, float]]] = {"L": [], "F": []}
    samples: list[tuple[float, bool, bool]] = []

    async with client.ApiClient(configuration=via_proxy) as api_l:
        lead = LeaderElector(api_l, namespace, "ctl", "L", **timings)
        follow = LeaderElector(api, namespace, "ctl", "F", **timings)
        lead.on_change(lambda on: changes["L"].append((on, time.monotonic())))
        follow.on_change(lambda on: changes["F"].append((on, time.monotonic())))

        async def sampler() -> None:
            while True:
                samples.append((time.monotonic(), lead.is_leader, follow.is_leader))
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(lead.run())]
        sampling = asyncio.create_task(sampler())
        try:
            await asyncio.wait_for(lead.wait_leader(), timeout=10)
            tasks.append(asyncio.create_task(follow.run()))
            await asyncio.sleep(3 * RETRY_S)
            assert lead.is_leader and not follow.is_leader and follow.holder == "L"

            cut_at = time.monotonic()
            await proxy.cut(cut)
            await asyncio.wait_for(follow.wait_leader(), timeout=LEASE_S + 2 * RETRY_S + 5)
            await asyncio.sleep(0.05)
            last_renew = lead.renewed_at
            assert last_renew is not None

            l_last = max(t for t, on_l, _ in samples if on_l)
            l_off = min(t for t, on_l, _ in samples if t > l_last)
            f_on = min(t for t, _, on_f in samples if on_f)
            print(
                f"{cut}: leader stopped {l_off - last_renew:.2f} s after its last renew "
                f"({l_off - cut_at:.2f} s after the cut); follower acquired {f_on - last_renew:.2f} s after it"
            )
            # the cut-off leader stops at its renew deadline (checked on read; slack for 10 ms sampling when busy)...
            assert l_off <= last_renew + DEADLINE_S + 0.2
            assert l_off < last_renew + LEASE_S
            # ...and the follower acquires only after the lease expired by ITS clock, which started no earlier
            assert f_on >= last_renew + LEASE_S
            assert l_last < f_on
            # the loop noticed too: on_change(False) fired about at the deadline
            assert [on for on, _ in changes["L"]] == [True, False]
            assert changes["L"][1][1] - last_renew < DEADLINE_S + RETRY_S
            assert [on for on, _ in changes["F"]] == [True]
            spec = await read_spec(api, namespace, "ctl")
            assert spec["holderIdentity"] == "F" and spec["leaseTransitions"] == 1

            # connection back: the old leader sees F's renewals and stays a follower
            await proxy.restore()
            await asyncio.sleep(4 * RETRY_S)
            assert lead.holder == "F" and not lead.is_leader and follow.is_leader
            assert [on for on, _ in changes["L"]] == [True, False]

            # graceful stop of a follower writes nothing; of the leader, releases the lease
            tasks[0].cancel()
            await asyncio.wait({tasks[0]})
            assert (await read_spec(api, namespace, "ctl"))["holderIdentity"] == "F"
            await follow.release()
            await asyncio.wait_for(asyncio.wait({tasks[1]}), timeout=5)
            assert tasks[1].done() and not tasks[1].cancelled() and tasks[1].exception() is None
            assert not follow.is_leader
            spec = await read_spec(api, namespace, "ctl")
            assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
            assert spec["leaseTransitions"] == 1
        finally:
            sampling.cancel()
            for task in tasks:
                task.cancel()
            with suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, sampling, return_exceptions=True)
            await proxy.close()


@pytest.mark.asyncio
async def test_cancel_releases_and_successor_acquires_at_once(api: client.ApiClient, namespace: str) -> None:
    """Cancelling run() (graceful shutdown) releases; a fresh candidate then acquires at its first try, and a
    409 race between two candidates for a fresh Lease leaves exactly one leader."""
    timings = dict(lease_duration_s=LEASE_S, renew_deadline_s=DEADLINE_S, retry_period_s=RETRY_S)
    a = LeaderElector(api, namespace, "ctl", "a", **timings)
    b = LeaderElector(api, namespace, "ctl", "b", **timings)
    runs = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    try:
        done, _ = await asyncio.wait(
            {asyncio.create_task(a.wait_leader()), asyncio.create_task(b.wait_leader())},
            timeout=10,
            return_when=asyncio.FIRST_COMPLETED,
        )
        assert done
        await asyncio.sleep(2 * RETRY_S)
        assert a.is_leader != b.is_leader  # exactly one
        leader, follower, follower_run = (a, b, runs[1]) if a.is_leader else (b, a, runs[0])
        leader_run = runs[0] if leader is a else runs[1]
        assert leader.stats.transitions == 1 and follower.stats.transitions == 0

        leader_run.cancel()
        await asyncio.wait({leader_run})
        assert leader_run.cancelled() and not leader.is_leader
        released_at = time.monotonic()
        await asyncio.wait_for(follower.wait_leader(), timeout=LEASE_S)
        assert time.monotonic() - released_at < RETRY_S + SLACK_S
        spec = await read_spec(api, namespace, "ctl")
        assert spec["holderIdentity"] == follower.identity and spec["leaseTransitions"] == 1
        assert not follower_run.done()
    finally:
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
