"""One Deployment's annotations cannot freeze or reconfigure the cluster (issue 16, failure mode 5; and the security
bullet on teams): the live controller against a REAL kube-apiserver, one namespace holding a well-behaved model
(``chat``) beside hostile ones.

- ``huge``: ``concurrency`` = 10^400, a whole number that parses, which used to make every tick raise OverflowError
  (no model scaled at all);
- ``slicer``: hundredth-GPU time-slice shares and ``max-replicas: 100000``, which used to be scaled to fill the
  node and plan (and write) a cluster-wide device-plugin time-slicing config of 28 replicas for every GPU;
- ``wide`` and ``vip``: ``gpus-per-replica`` and ``priority`` of 10^400 (the first overflowed arbitration; the
  second ranked ahead of every other model);
- ``intruder``: claims a team the operator bound to another namespace.

Each hostile model gets a Warning Event naming the annotation, its value and the cap (or the binding) and keeps its
replicas; ``chat`` is scaled as if they were not there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node
from test_controller_kube import ScriptedLoad, _deployment, _events, _until, leading

from autoscaler.api.plan import ScaleModel
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.actuator import ActuatorConfig

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

BASE = {"slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
        "slotwise.io/cold-start-seconds": "10"}
HOSTILE = {
    "huge": {**BASE, "slotwise.io/concurrency": "1" + "0" * 400, "slotwise.io/slot-kinds": "whole"},
    "slicer": {**BASE, "slotwise.io/slot-kinds": "share", "slotwise.io/gpu-memory-gib": "0.1",
               "slotwise.io/gpu-compute-share": "0.01", "slotwise.io/max-replicas": "100000"},
    "wide": {**BASE, "slotwise.io/gpus-per-replica": "1" + "0" * 400},
    "vip": {**BASE, "slotwise.io/priority": "1" + "0" * 400},
    "intruder": {**BASE, "slotwise.io/slot-kinds": "whole", "slotwise.io/team": "search"},
}
# what each hostile model's Warning Event must name
EXPECTED = {
    "huge": ("slotwise.io/concurrency", "limits.max_concurrency"),
    "slicer": ("slotwise.io/max-replicas='100000'", "limits.max_time_slice_replicas"),
    "wide": ("slotwise.io/gpus-per-replica", "limits.max_gpus_per_replica"),
    "vip": ("slotwise.io/priority", "limits.max_priority"),
    "intruder": ("slotwise.io/team='search'", "bound to namespace(s) search-prod"),
}


@pytest_asyncio.fixture
async def hostile(api: client.ApiClient) -> AsyncIterator[dict]:
    """A namespace with ``chat`` and the hostile models, on one time-sliced L4 node with 8 GPUs of its own."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"hostile-{suffix}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    node = f"{suffix}-l4"
    # time-sliced 4 ways (GFD's replicas label; the device plugin advertises 32): shares are placeable
    await create_gpu_node(api, node, "NVIDIA-L4", 8, {"nvidia.com/gpu": "32", "cpu": "32", "memory": "128Gi",
                                                      "pods": "110"}, {"nvidia.com/gpu.replicas": "4"})
    apps = client.AppsV1Api(api)
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    await apps.create_namespaced_deployment(ns, _deployment(
        "chat", {**BASE, "slotwise.io/slot-kinds": "whole", "slotwise.io/max-replicas": "4"}, gpu))
    for name, values in HOSTILE.items():
        await apps.create_namespaced_deployment(ns, _deployment(name, values, gpu))
    play = ClusterPlay(api, ns, node_prefix=suffix)
    await play.ensure_service_account()
    for _ in range(3):
        await play.step()
    yield {"ns": ns, "suffix": suffix}
    await core.delete_node(node)


def _controller(api: client.ApiClient, ns: str, suffix: str, teams: tuple[TeamQuota, ...] = ()) -> Controller:
    settings = ControllerSettings(
        namespace=ns, lease_namespace=ns, lease_name=f"slotwise-{suffix}", identity=f"test-{suffix}",
        tick_s=1.0, http_port=0,
        # the time-slicing ConfigMap in the test's own namespace: nothing else in the session writes it
        actuator=ActuatorConfig(time_slicing_configmap=f"{ns}/time-slicing-config"),
        arbitration=ArbitrationPolicy(teams=teams),
    )
    load = {f"{ns}/{name}": 20.0 for name in ("chat", *HOSTILE)} | {f"{ns}/slicer": 5000.0}
    return Controller(api, settings, metrics_source=ScriptedLoad(load))


async def _only_refused(api: client.ApiClient, ctl: Controller, ns: str, refused: tuple[str, ...]) -> None:
    """One tick: ``chat`` scaled up and its scale written; each of ``refused`` planned nothing but its status,
    its Deployment untouched, and a Warning Event naming what it broke."""
    apps = client.AppsV1Api(api)
    result = await ctl.tick()
    scales = {a.model: a for a in result.plan.of_type(ScaleModel)}
    assert f"{ns}/chat" in scales and scales[f"{ns}/chat"].replicas > 1, result.plan.describe()
    assert (await apps.read_namespaced_deployment("chat", ns)).spec.replicas == scales[f"{ns}/chat"].replicas
    for name in refused:
        assert f"{ns}/{name}" not in scales, result.plan.describe()
        assert (await apps.read_namespaced_deployment(name, ns)).spec.replicas == 1

        async def warned(name: str = name) -> list:
            return [e for e in await _events(api, ns, name) if e.type == "Warning"]

        events = await _until(warned)
        assert events, f"no Warning Event for {name}"
        assert all(n in events[0].message for n in EXPECTED[name]), events[0].message


async def test_extreme_annotations_affect_only_their_own_model(api: client.ApiClient, hostile: dict) -> None:
    """Failure mode 5: before issue 16 the tick raised OverflowError (``huge``) and nothing was scaled; without
    ``huge``, ``slicer`` was scaled and planned a time-slicing config of 28 replicas for every GPU."""
    ns = hostile["ns"]
    ctl = _controller(api, ns, hostile["suffix"])
    async with leading(ctl):
        await _only_refused(api, ctl, ns, ("huge", "slicer", "wide", "vip"))
        # no model raised the cluster-wide time-slicing config past the cap
        try:
            cm = await client.CoreV1Api(api).read_namespaced_config_map("time-slicing-config", ns)
        except client.ApiException as e:
            assert e.status == 404
        else:
            config = yaml.safe_load(next(iter((cm.data or {}).values())))
            replicas = [r["replicas"] for r in config["sharing"]["timeSlicing"]["resources"]]
            assert max(replicas) <= ctl.core.limits.max_time_slice_replicas, replicas
        # the next tick again: the refused models stay refused, the others proceed
        await asyncio.sleep(1.1)
        again = await ctl.tick()
        assert not [a for a in again.plan.of_type(ScaleModel) if a.model.split("/")[1] in HOSTILE]


async def test_a_team_bound_to_another_namespace_is_refused(api: client.ApiClient, hostile: dict) -> None:
    """The security bullet: ``team`` is self-declared; the operator binds team ``search`` to namespace
    ``search-prod``, so ``intruder`` (in the test's namespace) claiming it is refused with an Event."""
    ns = hostile["ns"]
    ctl = _controller(api, ns, hostile["suffix"], teams=(TeamQuota("search", namespaces=("search-prod",)),))
    async with leading(ctl):
        await _only_refused(api, ctl, ns, tuple(HOSTILE))
