"""End to end (issue 17 item 2): the live controller scales a LeaderWorkerSet model by groups, against the REAL
kube-apiserver 1.20.2 with LeaderWorkerSet served as a CRD of the upstream shape (``tests/realparts/lws_crds.yaml``:
the upstream API served as a CRD, not the add-on's controller). :class:`ClusterPlay` plays the LWS controller
(leader + workers per group, upstream labels), the scheduler and the kubelet; the load is scripted
(:class:`ScriptedLoad`): the Kubernetes side is under test. The controller watches LeaderWorkerSets at the version
discovery picks, plans in groups (one replica = ``size`` pods of 8 GPUs each, placed together), writes the
LeaderWorkerSet's ``/scale``, and on the next tick observes the groups the LWS controller made.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kubernetes_asyncio import client
from realparts.clusterplay import ClusterPlay, create_gpu_node
from realparts.crds import crds_installed
from realparts.scripted import ScriptedLoad
from test_controller_kube import _settings, leading

from autoscaler.api.plan import ScaleModel
from autoscaler.live.controller import Controller

pytest_plugins = ("realparts.kube",)
pytestmark = pytest.mark.asyncio

H100 = "NVIDIA-H100-80GB-HBM3"
GROUP = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")


async def test_the_controller_scales_a_leaderworkerset_by_groups(api: client.ApiClient) -> None:
    suffix = uuid.uuid4().hex[:6]
    ns = f"lws-{suffix}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    nodes = [f"{suffix}-{i}" for i in range(6)]
    async with crds_installed(api, "lws_crds.yaml"):
        for n in nodes:
            await create_gpu_node(api, n, H100, 8, {"nvidia.com/gpu": "8", "cpu": "96", "pods": "110"})
        try:
            await client.CustomObjectsApi(api).create_namespaced_custom_object(*GROUP[:2], ns, GROUP[2], {
                "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                "metadata": {"name": "big", "annotations": {
                    "slotwise.io/slo-latency-ms": "500", "slotwise.io/service-time-ms": "100",
                    "slotwise.io/cold-start-seconds": "10", "slotwise.io/max-replicas": "3",
                    "slotwise.io/gpus-per-replica": "8", "slotwise.io/slot-kinds": "whole"}},
                "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {
                    "metadata": {"labels": {"app": "big"}},
                    "spec": {"nodeSelector": {"nvidia.com/gpu.product": H100},
                             "containers": [{"name": "vllm", "image": "registry.invalid/vllm:test",
                                             "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}})
            play = ClusterPlay(api, ns, node_prefix=suffix, workloads=True)
            await play.ensure_service_account()
            for _ in range(3):
                await play.step()
            key = f"{ns}/big"
            ctl = Controller(api, _settings(ns, suffix), metrics_source=ScriptedLoad({key: 200.0}))
            await ctl.discover()
            async with leading(ctl):
                first = ctl.view()
                assert first.models[key].kind == "LeaderWorkerSet" and first.models[key].group_size == 2
                assert [r.ready for r in first.snapshot.models[key].replicas] == [True]  # one group of 2 pods

                result = await ctl.tick()
                scales = [a for a in result.plan.of_type(ScaleModel) if a.model == key]
                assert scales and scales[0].replicas > 1, result.plan.describe()
                groups = scales[0].replicas
                got = await client.CustomObjectsApi(api).get_namespaced_custom_object_scale(*GROUP[:2], ns,
                                                                                            GROUP[2], "big")
                assert got["spec"]["replicas"] == groups  # /scale counts groups, not pods

                for _ in range(3):
                    await play.step()
                pods = (await core.list_namespaced_pod(ns)).items
                assert len(pods) == 2 * groups
                for _ in range(50):  # the informers catch up with the new pods
                    obs = ctl.view().snapshot.models[key]
                    if len(obs.replicas) == groups and all(r.ready for r in obs.replicas):
                        break
                    await asyncio.sleep(0.1)
                assert [r.replica_id for r in obs.replicas] == [f"{ns}/big-{i}" for i in range(groups)]
                assert all(r.ready and len(r.group_slots) == 1 for r in obs.replicas)
                again = await ctl.tick()
                assert not [a for a in again.plan.of_type(ScaleModel) if a.model == key and a.replicas > groups]
        finally:
            for n in nodes:
                await core.delete_node(n)
