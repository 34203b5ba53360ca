"""A slot on DRA nodes as a ResourceClaimTemplate (``autoscaler.live.kube.dra_claims``): pure rendering per served
``resource.k8s.io`` version, the pod-template change that references it, which templates go the DRA way, and the
MIG re-layout refusal."""

from __future__ import annotations

import pytest
from realparts.dra import gpu_device, node_slice, resource_slice

from autoscaler.live.kube.dra import read_slices
from autoscaler.live.kube.dra_claims import (
    CLAIM_NAME,
    claim_removal_ops,
    claim_spec,
    claim_template,
    dra_target,
    mig_relayout_refusal,
    pod_template_changes,
    slot_resources,
    template_name,
    without_slotwise_claim,
)
from sharing.catalog import load_catalog
from sharing.render import GPU_PRODUCT

CAT = load_catalog()
H100, A100 = CAT.get("H100-80GB"), CAT.get("A100-80GB")
MIG_3G = {"limits": {"nvidia.com/mig-3g.40gb": "1"}, "requests": {"nvidia.com/mig-3g.40gb": "1"}}
WHOLE_2 = {"limits": {"nvidia.com/gpu": "2"}}
SEL = {GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"}


def test_v1_puts_the_request_under_exactly_and_v1beta1_does_not() -> None:
    v1 = claim_spec(WHOLE_2, {}, "v1")
    assert v1 == {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}]}}
    assert claim_spec(WHOLE_2, {}, "v1beta2") == v1
    assert claim_spec(WHOLE_2, {}, "v1beta1") == {"devices": {"requests": [{
        "name": "gpu", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}]}}


def test_a_mig_profile_is_the_mig_class_with_a_cel_selector_and_the_product() -> None:
    (req,) = claim_spec(MIG_3G, SEL, "v1", product_name="NVIDIA H100 80GB HBM3")["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "mig.nvidia.com"
    assert [s["cel"]["expression"] for s in req["exactly"]["selectors"]] == [
        'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',
        'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"']
    # the exact name unknown: GFD's spelling is compared
    (req,) = claim_spec(MIG_3G, SEL, "v1beta1")["devices"]["requests"]
    assert req["selectors"][0]["cel"]["expression"] == (
        'device.attributes["gpu.nvidia.com"].productName.replace(" ", "-") == "NVIDIA-H100-80GB-HBM3"')


def test_a_share_asks_for_memory_capacity_where_the_version_has_it() -> None:
    (req,) = claim_spec({"limits": {"nvidia.com/gpu": "1"}}, {}, "v1", share_memory_gib=20)["devices"]["requests"]
    assert req["exactly"]["capacity"] == {"requests": {"memory": "20480Mi"}}
    with pytest.raises(ValueError, match="v1beta1"):
        claim_spec({"limits": {"nvidia.com/gpu": "1"}}, {}, "v1beta1", share_memory_gib=20)
    with pytest.raises(ValueError, match="one whole GPU"):
        claim_spec(MIG_3G, {}, "v1", share_memory_gib=20)
    with pytest.raises(ValueError, match="one GPU resource"):
        claim_spec({"limits": {"cpu": "4"}}, {}, "v1")


def test_the_template_is_named_by_its_spec_and_owned_by_the_workload() -> None:
    spec = claim_spec(MIG_3G, SEL, "v1")
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm", "uid": "u-1"}
    t = claim_template("ml", owner, spec, "v1")
    assert t["apiVersion"] == "resource.k8s.io/v1" and t["kind"] == "ResourceClaimTemplate"
    assert t["metadata"]["name"] == template_name("llm", spec) and t["metadata"]["name"].startswith("llm-gpu-")
    assert t["metadata"]["ownerReferences"][0]["uid"] == "u-1" and t["spec"] == {"spec": spec}
    assert template_name("llm", claim_spec(WHOLE_2, SEL, "v1")) != t["metadata"]["name"]  # another slot, another


def test_the_pod_template_references_the_claim_instead_of_nvidia_resources() -> None:
    pod_spec = {"nodeSelector": {**SEL, "pool": "inference"},
                "resourceClaims": [{"name": "nic", "resourceClaimName": "rdma"},
                                   {"name": CLAIM_NAME, "resourceClaimTemplateName": "llm-gpu-old"}],
                "containers": [{"name": "server", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "cpu": "4"}, "requests": {"nvidia.com/gpu": "1"},
                    "claims": [{"name": "nic"}]}}]}
    got = pod_template_changes(pod_spec, "server", "llm-gpu-new")
    assert got == {
        "resourceClaims": [{"name": "nic", "resourceClaimName": "rdma"},
                           {"name": CLAIM_NAME, "resourceClaimTemplateName": "llm-gpu-new"}],
        "resources": {"limits": {"cpu": "4"}, "claims": [{"name": "nic"}, {"name": CLAIM_NAME}]},
        "nodeSelector": {"pool": "inference"},
    }
    assert pod_template_changes({"containers": [{"name": "s"}], "nodeSelector": SEL}, "s", "t")["nodeSelector"] is None
    with pytest.raises(ValueError, match="container"):
        pod_template_changes(pod_spec, "other", "t")


def test_which_templates_go_the_dra_way() -> None:
    dra = read_slices([node_slice(H100, "d1", dynamic=1), node_slice(A100, "d2", plain=2)], CAT)
    plugin = [("gpu-1", {GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}), ("cpu-1", {})]
    t = dra_target(dra, plugin, SEL)
    assert t is not None and t.nodes == ("d1",) and t.product_name == "NVIDIA H100 80GB HBM3" and not t.shareable
    # A100s on both kinds of nodes: a pod template cannot ask both ways, the device plugin's stays
    assert dra_target(dra, plugin, {GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}) is None
    assert dra_target(dra, plugin, {}) is None  # any GPU: device-plugin nodes too
    assert dra_target(dra, [("cpu-1", {})], {}) is not None
    shared = read_slices([resource_slice("d3", [{**gpu_device(H100, 0), "allowMultipleAllocations": True}])], CAT)
    assert dra_target(shared, [], SEL).shareable  # type: ignore[union-attr]


def test_mig_relayout_refusal_names_the_dynamic_mig_gate() -> None:
    assert mig_relayout_refusal("n", True)[0] == "dra-dynamic-mig"
    why, message = mig_relayout_refusal("n", False)
    assert why == "dra-static-mig" and "DynamicMIG" in message and "refused" in message


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
@pytest.mark.parametrize("resources", [WHOLE_2, MIG_3G, {"limits": {"nvidia.com/mig-1g.10gb+me": "1"}}])
def test_a_rendered_template_reads_back_as_the_resources_it_came_from(version, resources) -> None:
    got = slot_resources(claim_spec(resources, SEL, version, product_name="NVIDIA H100 80GB HBM3"))
    assert got["limits"] == resources["limits"]
    assert slot_resources({"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "other"}}]}}) == {}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_model_whose_pods_claim_their_gpu_reads_as_asking_for_that_slot(version: str) -> None:
    """What slotwise wrote on a DRA node reads back as the slot it stands for: the model's template (the
    controller's SlotTemplate) asks for the MIG profile, so the core does not re-template it to what it has."""
    from autoscaler.live.controller import pod_templates
    from autoscaler.live.kube.translate import build_view

    mig = {"limits": {"nvidia.com/mig-3g.40gb": "1"}, "requests": {"nvidia.com/mig-3g.40gb": "1"}}
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "uid": "u1"}
    rct = {**claim_template("ns", owner, claim_spec(mig, {}, version), version), "kind": "ResourceClaimTemplate"}
    pod_spec = {"containers": [{"name": "srv", "resources": {"limits": {"cpu": "2"}}}]}
    changed = pod_template_changes(pod_spec, "srv", rct["metadata"]["name"])
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "chat", "namespace": "ns", "annotations": {"slotwise.io/slo-latency-ms": "500"}},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "chat"}},
                    "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {
                        "resourceClaims": changed["resourceClaims"],
                        "containers": [{"name": "srv", "resources": changed["resources"]}]}}}}
    without = build_view([dep], [], [], now=0.0)
    assert "nvidia.com/mig-3g.40gb" not in pod_templates(without.models)["ns/chat"].resources
    view = build_view([dep], [], [], now=0.0, resource_claim_templates=[rct])
    got = pod_templates(view.models)["ns/chat"].resources
    assert got == {"requests": {"nvidia.com/mig-3g.40gb": "1"}, "limits": {"nvidia.com/mig-3g.40gb": "1"}}, got
    assert view.models["ns/chat"].resources["limits"]["cpu"] == "2"  # what the container had stays


# -- back to device-plugin nodes: slotwise's claim leaves the pod template -------------------------------------------
def _dra_pod_spec(*, user_claim: bool) -> dict:
    """A pod spec as pod_template_changes leaves it, optionally with a claim of the user's own beside slotwise's."""
    pod_spec = {"nodeSelector": {**SEL, "pool": "inference"}, "containers": [
        {"name": "server", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4"}}}]}
    if user_claim:
        pod_spec["resourceClaims"] = [{"name": "scratch", "resourceClaimTemplateName": "nic"}]
        pod_spec["containers"][0]["resources"]["claims"] = [{"name": "scratch"}]
    want = pod_template_changes(pod_spec, "server", "llm-gpu-0123abcd")
    return {**pod_spec, "resourceClaims": want["resourceClaims"],
            "containers": [{"name": "server", "resources": want["resources"]}]}


def test_slotwise_claim_leaves_the_container_and_the_pod_spec() -> None:
    pod_spec = _dra_pod_spec(user_claim=False)
    assert pod_spec["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}]
    res, claims = without_slotwise_claim(pod_spec, pod_spec["containers"][0])
    assert res == {"limits": {"cpu": "4"}} and claims is None  # the claims key gone, not left empty
    assert claim_removal_ops("/spec/template", pod_spec) == [
        {"op": "remove", "path": "/spec/template/spec/resourceClaims"}]


def test_claims_that_are_not_slotwises_stay() -> None:
    pod_spec = _dra_pod_spec(user_claim=True)
    res, claims = without_slotwise_claim(pod_spec, pod_spec["containers"][0])
    assert res["claims"] == [{"name": "scratch"}]
    assert claims == [{"name": "scratch", "resourceClaimTemplateName": "nic"}]
    assert claim_removal_ops("/spec/leaderWorkerTemplate/workerTemplate", pod_spec) == [
        {"op": "replace", "path": "/spec/leaderWorkerTemplate/workerTemplate/spec/resourceClaims",
         "value": [{"name": "scratch", "resourceClaimTemplateName": "nic"}]}]


def test_a_template_without_slotwise_claim_needs_no_claim_change() -> None:
    plain = {"containers": [{"name": "server", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    assert without_slotwise_claim(plain, plain["containers"][0]) == ({"limits": {"nvidia.com/gpu": "1"}}, None)
    assert claim_removal_ops("/spec/template", plain) == []
    user_only = {"resourceClaims": [{"name": "scratch", "resourceClaimTemplateName": "nic"}], "containers": []}
    assert claim_removal_ops("/spec/template", user_only) == []  # the user's claim is not touched
