"""Two ``slotwise run`` processes against a REAL kube-apiserver: one acts; kill it, the other takes over within
the lease duration; never both at once; a SIGTERM'd leader releases the Lease so the follower starts at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from kubernetes_asyncio import client

if TYPE_CHECKING:
    from realparts.kube import KubeApiserver

pytest_plugins = ("realparts.kube",)

LEASE_S, RENEW_S, RETRY_S = 4.0, 3.0, 0.5
ACTING = re.compile(r"acting: tick \d+ at (?P<t>[0-9.]+)")


def _spawn(kube: KubeApiserver, ns: str, identity: str, workdir: Path) -> tuple[subprocess.Popen, Path]:
    config = workdir / f"{identity}.yaml"
    config.write_text(
        f"lease_duration_s: {LEASE_S}\nrenew_deadline_s: {RENEW_S}\nretry_period_s: {RETRY_S}\n"
    )
    log = workdir / f"{identity}.log"
    cmd = [sys.executable, "-m", "autoscaler.cli", "run", "--kubeconfig", str(kube.kubeconfig), "--config", str(config),
           "--namespace", ns, "--lease-namespace", ns, "--lease-name", "slotwise", "--identity", identity,
           "--tick", "0.2", "--listen", "127.0.0.1:0", "--log-level", "DEBUG"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, log


def _acting(log: Path) -> list[float]:
    return [float(m["t"]) for m in ACTING.finditer(log.read_text(errors="replace"))]


def _wait(pred, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


@pytest.fixture
def namespace(kube_apiserver: KubeApiserver) -> str:
    import asyncio

    name = f"lead-{uuid.uuid4().hex[:6]}"

    async def create() -> None:
        async with kube_apiserver.api_client() as api:
            await client.CoreV1Api(api).create_namespace(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    asyncio.run(create())
    return name


@pytest.mark.parametrize("how", ["kill", "term"])
def test_follower_takes_over_and_never_both_act(kube_apiserver: KubeApiserver, namespace: str, tmp_path: Path,
                                                how: str) -> None:
    a, a_log = _spawn(kube_apiserver, namespace, "ctl-a", tmp_path)
    b, b_log = _spawn(kube_apiserver, namespace, "ctl-b", tmp_path)
    try:
        assert _wait(lambda: bool(_acting(a_log)) or bool(_acting(b_log)), 60), (
            a_log.read_text()[-2000:] + b_log.read_text()[-2000:])
        time.sleep(2.0)
        a_acts, b_acts = _acting(a_log), _acting(b_log)
        assert bool(a_acts) != bool(b_acts), "exactly one process acts"
        leader, leader_log, follower_log = (a, a_log, b_log) if a_acts else (b, b_log, a_log)
        stopped_at = time.time()
        os.killpg(leader.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
        leader.wait(timeout=30)
        assert _wait(lambda: bool(_acting(follower_log)), LEASE_S + 10), follower_log.read_text()[-3000:]
        took_over = _acting(follower_log)[0]
        last_old = max(_acting(leader_log))
        assert took_over > last_old, "the follower acted while the old leader still did"
        if how == "kill":
            # the lease must expire first: never before the old leader's last act + ... but within the duration
            assert took_over - stopped_at <= LEASE_S + RETRY_S + 2.0, took_over - stopped_at
        else:
            # a graceful stop releases the Lease: the follower need not wait for it to expire
            assert took_over - stopped_at < LEASE_S, took_over - stopped_at
        if how == "term":
            assert "stopped" in leader_log.read_text()
    finally:
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
