"""Issue 30 item 1: a Ready pod whose scrape target never answered makes its model partial, against a REAL Prometheus.

The model ``alpha`` has two Ready pods. ``alpha-0`` serves and is scraped; ``alpha-1``'s target refuses every
scrape (nothing listens on its port: ``up == 0`` from its first scrape on), so it never exported a series and
nothing in Prometheus ties it to ``alpha`` -- its key label ``model_name`` is not a target label. Before, the
window was fresh and fully "observed": the load of one pod read as the model's, and a scale-down could follow. Now
the controller tells the metrics port which pods serve each model (``expect_pods``, from its informers), and a
down target whose ``namespace``/``pod`` target labels (what Kubernetes service discovery relabels onto targets)
name one of them is a target of that model not answering: partial, the rails hold.

What must not alarm: a pod that is not Ready (not told: a replica starting up is not serving yet), and a pod
that answers for the model through one target while another target naming it is down (a sidecar's port).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from autoscaler.api.plan import Reason
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.scaledown import ScaleDownState, normalize
from autoscaler.estimation.capacity import profile_from_spec
from autoscaler.live.prometheus.metrics import MetricNames, PrometheusMetrics
from autoscaler.policies import HPAPolicy
from autoscaler.policies.base import PolicyContext

pytest_plugins = ("realparts.prometheus",)

VLLM = MetricNames.preset("vllm")
MODELSERVER = Path(__file__).resolve().parents[1] / "realparts" / "modelserver.py"
STEP, WINDOW = 1.0, 8.0
ALPHA = ModelSpec("alpha", "team-a", concurrency=16, min_replicas=1, max_replicas=10)
BETA = ModelSpec("beta", "team-b", concurrency=16, min_replicas=1, max_replicas=10)
SPECS = {"team-a/alpha": ALPHA, "team-b/beta": BETA}
HPA = HPAPolicy(target_utilization=0.88, scale_down_stabilization_s=0.0)


def _query(url: str, promql: str) -> list[dict]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        return json.load(r)["data"]["result"]


def _wait_until(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s}s")


@pytest.fixture(scope="module")
def one_silent_pod(prometheus_factory, tmp_path_factory):
    from realparts.prometheus import free_port

    work = tmp_path_factory.mktemp("never")
    servers: list[subprocess.Popen] = []
    targets = []
    try:
        for seed, (pod, model, ns) in enumerate((("alpha-0", "alpha", "team-a"), ("beta-0", "beta", "team-b"))):
            port = free_port()
            replicas = work / f"{pod}.replicas"
            replicas.write_text("1")
            proc = subprocess.Popen(
                [sys.executable, str(MODELSERVER), "--port", str(port), "--model", model, "--rps", "50",
                 "--service-ms", "200", "--concurrency", "16", "--replicas-file", str(replicas),
                 "--seed", str(seed + 1)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            servers.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("listening"), line
            targets.append((f"127.0.0.1:{port}", {"namespace": ns, "pod": pod}))
        # alpha-1: nothing listens there, every scrape is refused (and beta-0's sidecar port, the same)
        targets.append((f"127.0.0.1:{free_port()}", {"namespace": "team-a", "pod": "alpha-1"}))
        targets.append((f"127.0.0.1:{free_port()}", {"namespace": "team-b", "pod": "beta-0"}))
        prom = prometheus_factory(scrape_targets=targets, scrape_interval_s=1.0)
        _wait_until(lambda: len(_query(prom.url, "up == 1")) == 2 and len(_query(prom.url, "up == 0")) == 2,
                    30.0, "two targets up, two down")
        time.sleep(WINDOW + 2.0)  # a whole window of alpha-0
        yield prom
    finally:
        for p in servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=10)


@pytest.mark.asyncio
async def test_a_ready_pod_whose_target_never_answered_makes_the_model_partial(one_silent_pod) -> None:
    prom = one_silent_pod
    async with PrometheusMetrics(prom.url, VLLM, step_s=STEP, window_s=WINDOW, stale_after_s=5.0) as pm:
        # the cluster: alpha has two Ready pods, beta one (its second target is a sidecar's port, down)
        pm.expect_pods({"team-a/alpha": ["team-a/alpha-0", "team-a/alpha-1"], "team-b/beta": ["team-b/beta-0"]})
        now = time.time()
        w = await pm.window(now, SPECS)
        alpha = w.models["team-a/alpha"]
        assert not alpha.stale  # fresh: one pod's load, read as the whole model's before
        assert alpha.partial == "1 of 2 scrape targets not answering (up == 0)" and alpha.observed_fraction == 0.5
        ctx = PolicyContext(now=now, spec=ALPHA, current_replicas=2, ready_replicas=2, metrics=alpha,
                            metrics_step_s=STEP, forecast=None, capacity=profile_from_spec(ALPHA), state=None)
        res = normalize(HPA, ctx, ScaleDownState(started_at=0.0))
        assert res.desired == 2 and res.reason is Reason.METRICS_PARTIAL, res.detail
        # beta answers through beta-0's own target: its down sidecar port is not beta's data missing
        beta = w.models["team-b/beta"]
        assert beta.partial is None and beta.observed_fraction == 1.0 and not beta.stale

        # alpha-1 not Ready (starting up): not told, so its silent target is nobody's -- no alarm
        pm.expect_pods({"team-a/alpha": ["team-a/alpha-0"], "team-b/beta": ["team-b/beta-0"]})
        alpha = (await pm.window(time.time(), SPECS)).models["team-a/alpha"]
        assert alpha.partial is None and alpha.observed_fraction == 1.0


def test_the_health_query_keeps_the_pod_target_labels() -> None:
    pm = PrometheusMetrics("http://x", VLLM)
    q = pm.health_query()
    assert "max by (namespace, model_name, pod, job, instance) (up) == 0" in q
    assert "group by (namespace, model_name, pod, job, instance)" in q


class _Source:
    """A metrics port that records the pods it is told before each window."""

    def __init__(self) -> None:
        self.told: list[dict] = []
        self.last_error: str | None = None

    def expect_pods(self, pods) -> None:  # type: ignore[no-untyped-def]
        self.told.append({k: sorted(v) for k, v in pods.items()})

    async def window(self, now: float, models):  # type: ignore[no-untyped-def]
        from autoscaler.api.snapshot import MetricsWindow

        return MetricsWindow(now=now, step_s=STEP, models={})


@pytest.mark.asyncio
async def test_the_controller_tells_the_metrics_port_the_ready_pods_of_each_model() -> None:
    from types import SimpleNamespace

    from autoscaler.api.snapshot import ClusterSnapshot, ModelObservation, Replica
    from autoscaler.live.controller import Controller, ControllerSettings
    from sharing.slots import Inventory

    replicas = (Replica("team-a/alpha-0", None, ready=True, started_at=0.0),
                Replica("team-a/alpha-1", None, ready=True, started_at=0.0),
                Replica("team-a/alpha-2", None, ready=False, started_at=0.0),  # starting: not serving yet
                Replica("team-a/alpha-3", None, ready=True, started_at=0.0, draining=True))
    snapshot = ClusterSnapshot(now=100.0, models={"team-a/alpha": ModelObservation("alpha", ALPHA, 4, replicas)},
                               inventory=Inventory.from_nodes([]))
    source = _Source()
    controller = Controller(None, ControllerSettings(http_port=0), metrics_source=source)  # type: ignore[arg-type]
    await controller._metrics_window(SimpleNamespace(snapshot=snapshot))  # type: ignore[arg-type]
    assert source.told == [{"team-a/alpha": ["team-a/alpha-0", "team-a/alpha-1"]}]
