"""A model re-templated from a DRA pool back to device-plugin nodes, against the real kube-apiserver (1.20.2): the
pod templates lose slotwise's claim (the container's ``resources.claims`` entry and the pod spec's
``resourceClaims`` entry named ``slotwise-gpu``) as they get ``nvidia.com/gpu`` back, and claims of the user's own
stay (issue 17 review). Before, the claim stayed beside the device-plugin resource and the pods stayed Pending.

1.20's built-in PodSpec has neither field (1.26+), so a Deployment cannot carry them there; the LeaderWorkerSet CRD
(tests/realparts/lws_crds.yaml) stores its pod templates as the real CRD does, every field kept, so an LWS shows
the patch's effect on what the server stores. The patch operations themselves are pinned in test_dra_claims.py."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from realparts.crds import crds_installed
from test_workloads_kube import read_view

from autoscaler.api.plan import Plan, SetSlotTemplate
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.live.kube.dra_claims import CLAIM_NAME
from autoscaler.live.kube.workloads import LEADERWORKERSET_KIND
from sharing.render import GPU_PRODUCT

pytest_plugins = ("realparts.kube",)

aio = pytest.mark.asyncio
H100 = "NVIDIA-H100-80GB-HBM3"
LWS = ("leaderworkerset.x-k8s.io", "v1")


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-drab-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


def dra_template(container: str, *, user_claim: bool) -> dict[str, Any]:
    """A pod template as slotwise's DRA path leaves it (dra_claims.pod_template_changes), optionally with a claim of
    the user's own (a NIC, say) beside slotwise's."""
    claims = [{"name": CLAIM_NAME}] + ([{"name": "scratch"}] if user_claim else [])
    pod_claims = [{"name": CLAIM_NAME, "resourceClaimTemplateName": "llm-gpu-0123abcd"}]
    if user_claim:
        pod_claims.append({"name": "scratch", "resourceClaimTemplateName": "nic"})
    return {"metadata": {"labels": {"app": "llm"}},
            "spec": {"nodeSelector": {"pool": "inference"}, "resourceClaims": pod_claims,
                     "containers": [{"name": container, "image": "registry.invalid/vllm:test",
                                     "resources": {"limits": {"cpu": "4"}, "claims": claims}}]}}


async def _lws(api: client.ApiClient, ns: str, name: str, *, user_claim: bool) -> None:
    leader = dra_template("leader", user_claim=user_claim)
    await client.CustomObjectsApi(api).create_namespaced_custom_object(*LWS, ns, "leaderworkersets", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "annotations": {"slotwise.io/slo-latency-ms": "500",
                                                   "slotwise.io/gpus-per-replica": "8"}},
        "spec": {"replicas": 0, "leaderWorkerTemplate": {
            "size": 2, "leaderTemplate": leader, "workerTemplate": dra_template("vllm", user_claim=user_claim)}}})


async def _templates(api: client.ApiClient, ns: str, name: str) -> dict[str, dict[str, Any]]:
    got = await client.CustomObjectsApi(api).get_namespaced_custom_object(*LWS, ns, "leaderworkersets", name)
    lwt = got["spec"]["leaderWorkerTemplate"]
    return {which: copy.deepcopy(lwt[which]["spec"]) for which in ("leaderTemplate", "workerTemplate")}


CHANGE = ({"limits": {"nvidia.com/gpu": "8"}}, {GPU_PRODUCT: H100})


@aio
@pytest.mark.parametrize("user_claim", [False, True])
async def test_a_model_moved_from_dra_to_the_device_plugin_loses_slotwises_claim(api, ns, user_claim: bool) -> None:
    async with crds_installed(api, "lws_crds.yaml"):  # resource.k8s.io is not served: the device-plugin path
        await _lws(api, ns, "llm", user_claim=user_claim)
        key = f"{ns}/llm"
        change = SetSlotTemplate(key, *CHANGE)
        v = await read_view(api, ns, "none-", LEADERWORKERSET_KIND)
        r = await KubeActuator(api, ActuatorConfig()).apply(Plan(0.0, [change]), v)
        assert not r.errors and len(r.applied) == 1, r
        for which, spec in (await _templates(api, ns, "llm")).items():
            res = spec["containers"][0]["resources"]
            assert res["limits"] == {"cpu": "4", "nvidia.com/gpu": "8"}, which
            assert spec["nodeSelector"] == {"pool": "inference", GPU_PRODUCT: H100}, which
            if user_claim:  # the user's claim stays, in both places
                assert res["claims"] == [{"name": "scratch"}], which
                assert spec["resourceClaims"] == [{"name": "scratch", "resourceClaimTemplateName": "nic"}], which
            else:  # nothing left: the keys go, not left empty
                assert "claims" not in res and "resourceClaims" not in spec, (which, spec)
        # the same change again: nothing to write
        v = await read_view(api, ns, "none-", LEADERWORKERSET_KIND)
        again = await KubeActuator(api, ActuatorConfig()).apply(Plan(0.0, [change]), v)
        assert not again.applied and [why for _, why in again.skipped] == ["unchanged"], again
