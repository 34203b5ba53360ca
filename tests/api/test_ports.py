"""The ports of autoscaler/api/ports.py are what the adapters implement: every protocol member is there with the same
parameters (names, kinds, annotations), synchronous or asynchronous as declared -- checked with inspect, not with
isinstance on a runtime-checkable protocol (which looks at names only)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

import pytest

from autoscaler.api import ports
from autoscaler.api.plan import Plan
from autoscaler.api.snapshot import ClusterSnapshot
from autoscaler.live.controller import Controller, ControllerSettings, InformerCluster
from autoscaler.live.kube.actuator import KubeActuator
from autoscaler.live.kube.objects import ClusterView
from autoscaler.live.prometheus.metrics import MetricNames, PrometheusMetrics
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.metrics import SimMetrics

PAIRS: list[tuple[type, type]] = [
    (SimCluster, ports.ClusterPort),
    (SimMetrics, ports.MetricsPort),
    (SimCluster, ports.Actuator),
    (InformerCluster, ports.ViewPort),
    (PrometheusMetrics, ports.AsyncMetricsPort),
    (KubeActuator, ports.AsyncActuator),
]


def _methods(proto: type) -> dict[str, Callable]:
    return {k: v for k, v in vars(proto).items() if inspect.isfunction(v) and not k.startswith("_")}


def _hints(fn: Callable) -> dict[str, object]:
    return typing.get_type_hints(fn)


def _satisfies(hint: object, declared: object) -> bool:
    """An adapter's annotation against the protocol's: equal, or for a type variable one its bound admits (a
    ``ClusterRead``: a class whose ``snapshot`` is a ClusterSnapshot)."""
    if isinstance(declared, typing.TypeVar):
        if declared.__bound__ is None:
            return True
        assert declared.__bound__ is ports.ClusterRead, declared
        return isinstance(hint, type) and typing.get_type_hints(hint).get("snapshot") is ClusterSnapshot
    return hint == declared


def _mismatches(adapter: type, proto: type) -> list[str]:
    """What ``adapter`` lacks or has otherwise than ``proto`` declares (empty: it implements the port)."""
    out: list[str] = []
    for name, declared in _methods(proto).items():
        got = inspect.getattr_static(adapter, name, None)
        where = f"{adapter.__name__}.{name}"
        if not inspect.isfunction(got):
            out.append(f"{where} is missing")
            continue
        if inspect.iscoroutinefunction(got) != inspect.iscoroutinefunction(declared):
            out.append(f"{where}: {proto.__name__} declares it "
                       f"{'async' if inspect.iscoroutinefunction(declared) else 'sync'}")
        want = list(inspect.signature(declared).parameters.values())
        have = list(inspect.signature(got).parameters.values())
        if [(p.name, p.kind) for p in have[: len(want)]] != [(p.name, p.kind) for p in want]:
            out.append(f"{where}{inspect.signature(got)}: {proto.__name__} says {inspect.signature(declared)}")
        extra = [p.name for p in have[len(want):]
                 if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if extra:
            out.append(f"{where} needs {extra}, which {proto.__name__} does not pass")
        hints = _hints(got)
        for param, hint in _hints(declared).items():
            if not _satisfies(hints.get(param), hint):
                out.append(f"{where}: {param} is {hints.get(param)}, {proto.__name__} says {hint}")
    return out


@pytest.mark.parametrize(("adapter", "proto"), PAIRS, ids=[f"{a.__name__}-{p.__name__}" for a, p in PAIRS])
def test_the_adapter_implements_its_port(adapter: type, proto: type) -> None:
    assert _methods(proto), f"{proto.__name__} declares no method"
    assert _mismatches(adapter, proto) == []


class _SyncActuator:
    def apply(self, plan: Plan, view: ClusterView) -> None: ...


class _NoView:
    async def apply(self, plan: Plan) -> None: ...


class _SnapshotAt:
    def snapshot(self, at: float) -> ClusterSnapshot: ...  # type: ignore[empty-body]


def test_the_check_sees_a_wrong_adapter() -> None:
    assert _mismatches(_SyncActuator, ports.AsyncActuator) == [
        "_SyncActuator.apply: AsyncActuator declares it async"]
    assert _mismatches(_NoView, ports.AsyncActuator)[0].startswith("_NoView.apply(self, plan: 'Plan')")
    assert _mismatches(_SnapshotAt, ports.ClusterPort)[0].startswith("_SnapshotAt.snapshot(self, at")
    assert _mismatches(_NoView, ports.MetricsPort) == ["_NoView.window is missing"]


def test_the_live_actuator_takes_the_view_the_live_cluster_port_gives() -> None:
    gives = _hints(InformerCluster.view)["return"]
    assert gives is ClusterView
    assert _hints(KubeActuator.apply)["view"] is gives


def test_declared_attributes_are_there() -> None:
    metrics = PrometheusMetrics("http://127.0.0.1:9", MetricNames.preset("vllm"))
    for name in typing.get_type_hints(ports.AsyncMetricsPort):
        assert hasattr(metrics, name), name
    assert metrics.last_error is None


def test_the_controller_holds_its_ports() -> None:
    ctl = Controller(object(), ControllerSettings(prometheus_url="http://127.0.0.1:9"))
    assert isinstance(ctl.cluster, InformerCluster)
    assert isinstance(ctl.actuator, KubeActuator)
    assert isinstance(ctl.prometheus, PrometheusMetrics)
    hints = typing.get_type_hints(Controller.__init__)
    assert hints["metrics_source"] == ports.AsyncMetricsPort | None
