"""End to end: a real Prometheus scrapes model-server processes driven by a slice of the Azure LLM trace; the
controller reads Prometheus and scales the Deployment in a real kube-apiserver accordingly.

The model server (``tests/realparts/modelserver.py``) serves with as many replicas as the Deployment has Ready
pods (the test writes that count to its replicas file), so scaling up really lowers its queue and latency.
:class:`realparts.clusterplay.ClusterPlay` turns the Deployment's scale into Ready pods on the test's GPU node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay

from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.objects import STATUS_ANNOTATION
from forecasting.traces import resolve_trace
from forecasting.traces.convert import to_rate_series

pytest_plugins = ("realparts.kube", "realparts.prometheus")
pytestmark = pytest.mark.asyncio

MODELSERVER = Path(__file__).resolve().parents[1] / "realparts" / "modelserver.py"
SERVICE_MS = 200.0  # one request holds a replica's only slot for 200 ms: 5 req/s per replica
TIME_COMPRESSION = 5.0
BIN_PLAY_S = 10.0 / TIME_COMPRESSION  # each 10 s bin of the trace is played for 2 s
SCALE = 3.0  # the slice's 1.3..7 req/s become 4..21 req/s


def trace_slice() -> np.ndarray:
    """The first 30 ten-second bins of the bundled Azure LLM 'conv' model (a ramp with noise), scaled."""
    series = to_rate_series(resolve_trace("azure-llm-2023"), 10.0)
    return np.nan_to_num(series.rates[series.models.index("conv"), :30]) * SCALE


async def test_controller_scales_from_real_prometheus(
    api: client.ApiClient, prometheus_factory, tmp_path: Path
) -> None:
    from realparts.prometheus import free_port

    suffix = uuid.uuid4().hex[:6]
    ns = f"e2e-{suffix}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"{suffix}-l4", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4",
                                                           "nvidia.com/gpu.count": "8"}}}
    capacity = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "256Gi", "pods": "110"}
    created = await core.create_node(node)
    created.status.capacity = capacity
    created.status.allocatable = capacity
    await core.replace_node_status(node["metadata"]["name"], created)
    labels = {"app": "chat"}
    annotations = {"slotwise.io/slo-latency-ms": "1000", "slotwise.io/service-time-ms": str(SERVICE_MS),
                   "slotwise.io/cold-start-seconds": "2", "slotwise.io/max-replicas": "8",
                   "slotwise.io/slot-kinds": "whole"}
    await apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "labels": labels, "annotations": annotations},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "vllm", "image": "registry.invalid/vllm:test",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    })
    play = ClusterPlay(api, ns, node_prefix=suffix)
    await play.ensure_service_account()
    await play.step()

    rates = trace_slice()
    trace_file = tmp_path / "chat.rps"
    trace_file.write_text("\n".join(f"{r:.3f}" for r in rates) + "\n")
    replicas_file = tmp_path / "chat.replicas"
    replicas_file.write_text("1")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(MODELSERVER), "--port", str(port), "--model", "chat", "--trace", str(trace_file),
         "--trace-step-s", str(BIN_PLAY_S), "--service-ms", str(SERVICE_MS), "--concurrency", "1",
         "--replicas-file", str(replicas_file), "--seed", "7"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("listening")
        prom = prometheus_factory(scrape_targets=[(f"127.0.0.1:{port}", {"namespace": ns})], scrape_interval_s=1.0)
        settings = ControllerSettings(
            namespace=ns, lease_namespace=ns, lease_name="slotwise", identity=f"e2e-{suffix}", tick_s=1.0,
            http_host="127.0.0.1", http_port=0, prometheus_url=prom.url, metrics_step_s=2.0, metrics_window_s=60.0,
            stale_after_s=10.0, lease_duration_s=4.0, renew_deadline_s=3.0, retry_period_s=0.5,
            # the policy's windows compressed like the trace's time
            policy_knobs={"tick_s": 10.0 / TIME_COMPRESSION, "stable_window_s": 60.0 / TIME_COMPRESSION,
                          "panic_window_s": 10.0 / TIME_COMPRESSION,
                          "scale_down_stabilization_s": 120.0 / TIME_COMPRESSION},
            history_hours=0.0,
        )
        ctl = Controller(api, settings)
        # time runs 5x faster here than in the trace: so does the forecaster's step (60 s -> 12 s)
        ctl.core.forecaster_factory = lambda: FleetForecaster(step_s=60.0 / TIME_COMPRESSION)
        stop = asyncio.Event()
        loop_task = asyncio.create_task(ctl.run(stop))
        scales: list[tuple[float, int, int]] = []  # (trace time, Deployment scale, ready replicas)
        started = asyncio.get_running_loop().time()
        try:
            while (elapsed := asyncio.get_running_loop().time() - started) < len(rates) * BIN_PLAY_S + 10:
                await play.step()
                ready = sum(1 for p in await play.pods() if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions")
                    or []))
                replicas_file.write_text(str(max(1, ready)))
                dep = await apps.read_namespaced_deployment("chat", ns)
                scales.append((elapsed, dep.spec.replicas, ready))
                assert not loop_task.done(), loop_task.exception()
                await asyncio.sleep(0.5)
        finally:
            stop.set()
            await asyncio.wait_for(loop_task, timeout=30)
        dep = await apps.read_namespaced_deployment("chat", ns)
        status = json.loads(dep.metadata.annotations[STATUS_ANNOTATION])
    finally:
        await core.delete_node(node["metadata"]["name"])  # cluster-wide: it would serve other tests' models
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)

    peak = float(rates.max())
    most = max(s for _, s, _ in scales)
    # The load arrives from the first second; one replica serves 5 req/s, the trace needs 2..5: the controller,
    # reading Prometheus, scaled up within a few of its (compressed) ticks and never beyond its bound.
    first_up = next(t for t, s, _ in scales if s > 1)
    assert first_up < 15.0, scales[:40]
    assert math.ceil(peak * SERVICE_MS / 1000.0) <= most <= 8, (peak, scales)
    # the replicas were there: the model server saw them through the replicas file (ready pods)
    assert max(r for _, _, r in scales) == most
    # what it reports: the load it read matches the load the server was driven with (last 10 s of the trace)
    exposition = ctl.exporter.exposition().decode()
    observed = float(next(line.split()[-1] for line in exposition.splitlines()
                          if line.startswith(f'slotwise_observed_requests_per_second{{model="{ns}/chat"}}')))
    driven = float(rates[-5:].mean())
    assert 0.5 * driven <= observed <= 1.5 * driven + 2.0, (observed, driven)
    # ... and the forecast it sized for covers that load; the decision is explained in the status
    assert status["forecastRps"] is not None and status["forecastRps"] >= 0.8 * driven, status
    assert status["reason"] and status["sloLatencyMs"] == 1000 and status["desired"] == dep.spec.replicas
