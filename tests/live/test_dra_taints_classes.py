"""Issue 30, DRA: device taints and DeviceClass selectors decide which published devices are capacity (pure).

A device with a ``NoSchedule`` / ``NoExecute`` taint, or one the DeviceClass slotwise's claims name does not select
(``gpu.nvidia.com`` for whole GPUs and shares, ``mig.nvidia.com`` for MIG devices), takes no new replica: what pods
do not hold of it is held by ``(dra unusable)`` in the inventory, so the packer places nothing there. Pods that
already hold such a device keep their slot. The apiserver side is ``tests/live/test_dra_apiserver.py``.
"""

from __future__ import annotations

import copy

import pytest
from realparts.dra import as_v1beta1, claim, gpu_device, mig_device, node_slice, resource_slice
from test_dra_translate import _plan, bare_node, dra_pod
from test_kube_translate import NS, deployment, view

from autoscaler.api.plan import PlaceReplica
from autoscaler.live.kube.dra import UNUSABLE_MODEL, read_slices
from autoscaler.live.kube.dra_classes import NotUnderstood, compile_selector, device_class_check
from sharing.catalog import load_catalog
from sharing.slots import SlotKind

CAT = load_catalog()
H100 = CAT.get("H100-80GB")
GPU_SEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_SEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"


def device_class(name: str, *exprs: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs]}}


NVIDIA_CLASSES = [device_class("gpu.nvidia.com", GPU_SEL), device_class("mig.nvidia.com", MIG_SEL)]


def tainted(dev: dict, effect: str, key: str = "gpu.nvidia.com/xid", value: str = "79") -> dict:
    out = copy.deepcopy(dev)
    out.setdefault("taints", []).append({"key": key, "value": value, "effect": effect})
    return out


def unusable(inv, node: str) -> list:
    return sorted((s.devices, s.kind, s.profile, s.start) for o, s in inv.allocations()
                  if inv.model_of(o) == UNUSABLE_MODEL and s.node == node)


# -- the selector subset ----------------------------------------------------------------------------------------
def test_nvidias_device_class_selectors_are_evaluated() -> None:
    gpu, mig = device_class_check(NVIDIA_CLASSES[0]), device_class_check(NVIDIA_CLASSES[1])
    assert gpu.not_understood is None and mig.not_understood is None
    assert gpu.selects("gpu.nvidia.com", {"type": "gpu"}) and not gpu.selects("gpu.nvidia.com", {"type": "mig"})
    assert mig.selects("gpu.nvidia.com", {"type": "mig"}) and not gpu.selects("other.example.com", {"type": "gpu"})


@pytest.mark.parametrize(("expr", "attrs", "selected"), [
    ('device.attributes["gpu.nvidia.com"]["productName"] == "NVIDIA H100 80GB HBM3"',
     {"productName": "NVIDIA H100 80GB HBM3"}, True),
    ("device.attributes['gpu.nvidia.com'].productName != 'NVIDIA H100 80GB HBM3'",
     {"productName": "NVIDIA H100 80GB HBM3"}, False),
    ("device.attributes['gpu.nvidia.com'].minor == 3", {"minor": 3}, True),
    ("device.attributes['gpu.nvidia.com'].minor == 3", {"minor": "3"}, False),  # CEL does not convert types
    ("true && device.attributes['gpu.nvidia.com'].healthy == true", {"healthy": True}, True),
    ("'gpu' == device.attributes['gpu.nvidia.com'].type", {"type": "gpu"}, True),
    ("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:00'",
     {"resource.kubernetes.io/pcieRoot": "pci0000:00"}, True),
    ("device.attributes['gpu.nvidia.com'].uuid == 'GPU-1'", {}, False),  # missing: a CEL error, not selected
])
def test_conjunctions_of_equalities_on_driver_and_attributes(expr: str, attrs: dict, selected: bool) -> None:
    check = device_class_check(device_class("c", expr))
    assert check.not_understood is None
    assert check.selects("gpu.nvidia.com", attrs) is selected


@pytest.mark.parametrize("expr", [
    "device.attributes['gpu.nvidia.com'].type == 'gpu' || device.attributes['gpu.nvidia.com'].type == 'mig'",
    "!(device.attributes['gpu.nvidia.com'].type == 'mig')",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')",
    "'productName' in device.attributes['gpu.nvidia.com']",
])
def test_anything_else_is_not_understood_and_selects_nothing(expr: str) -> None:
    with pytest.raises(NotUnderstood):
        compile_selector(expr)
    check = device_class_check(device_class("c", expr))
    assert check.not_understood is not None and expr in check.not_understood
    assert not check.selects("gpu.nvidia.com", {"type": "gpu", "productName": "NVIDIA H100 80GB HBM3"})


# -- taints -----------------------------------------------------------------------------------------------------
def test_a_tainted_device_takes_no_new_replica_and_a_pod_holding_it_keeps_it() -> None:
    devs = [tainted(gpu_device(H100, 0), "NoSchedule"), tainted(gpu_device(H100, 1), "NoExecute"),
            tainted(gpu_device(H100, 2), "None"), gpu_device(H100, 3)]
    p = dra_pod("a-0", "a")
    v = view([deployment("a")], [p], [bare_node("d1")], resource_slices=[resource_slice("d1", devs)],
             resource_claims=[claim(NS, "a-0-gpu", "d1", ["gpu-1"], pod=p)])
    inv = v.snapshot.inventory
    assert unusable(inv, "d1") == [((0,), SlotKind.WHOLE, None, None)]  # gpu-1's pod holds it; None: no effect
    (slot,) = inv.slots_of(f"{NS}/a-0")
    assert slot.devices == (1,)
    assert inv.idle_gpus("d1") == 2  # gpu-2 and gpu-3
    assert any("gpu-0: tainted gpu.nvidia.com/xid=79:NoSchedule; takes no new replica" in x for x in v.problems)
    assert any("gpu-1: tainted gpu.nvidia.com/xid=79:NoExecute" in x for x in v.problems)


def test_the_planner_places_nothing_on_tainted_devices() -> None:
    devs = [gpu_device(H100, 0), *(tainted(gpu_device(H100, i), "NoSchedule") for i in (1, 2)), gpu_device(H100, 3)]
    p = dra_pod("a-0", "a")
    v = view([deployment("a", replicas=1)], [p], [bare_node("d1")], resource_slices=[resource_slice("d1", devs)],
             resource_claims=[claim(NS, "a-0-gpu", "d1", ["gpu-0"], pod=p)])
    placed = [a.slot.devices for a in _plan(v).actions if isinstance(a, PlaceReplica)]
    assert placed and all(d == (3,) for d in placed), placed


def test_v1beta1_taints_under_basic_read_the_same() -> None:
    s = resource_slice("d1", [tainted(gpu_device(H100, 0), "NoSchedule"), gpu_device(H100, 1)])
    assert read_slices([as_v1beta1(s)], CAT).nodes["d1"] == read_slices([s], CAT).nodes["d1"]
    assert read_slices([s], CAT).nodes["d1"].devices["gpu-0"].unusable.startswith("tainted")


def test_a_tainted_mig_instance_and_the_rest_of_a_tainted_shared_gpu_are_held() -> None:
    mig = [mig_device(H100, 0, "3g", 0), tainted(mig_device(H100, 0, "3g", 4), "NoSchedule")]
    shared = tainted({**gpu_device(H100, 1), "allowMultipleAllocations": True}, "NoSchedule")
    p = dra_pod("a-0", "a")
    v = view([deployment("a")], [p], [bare_node("d1")], resource_slices=[resource_slice("d1", [*mig, shared])],
             resource_claims=[claim(NS, "a-0-gpu", "d1", ["gpu-1"], pod=p, consumed_memory_gib=20)])
    inv = v.snapshot.inventory
    held = unusable(inv, "d1")
    assert ((0,), SlotKind.MIG, "3g", 4) in held and ((1,), SlotKind.SHARE, None, None) in held
    assert not inv.device("d1", 0).occupants(("3g", 0))  # the untainted instance stays free
    assert inv.device_free_memory_gib("d1", 1) == 0.0  # the pod's 20 GiB share, the rest unusable


# -- DeviceClasses ----------------------------------------------------------------------------------------------
def test_only_devices_the_claims_device_class_selects_are_capacity() -> None:
    # the admin narrowed gpu.nvidia.com to one PCIe bus range; MIG devices need mig.nvidia.com, which is missing
    narrowed = device_class("gpu.nvidia.com", GPU_SEL, "device.attributes['gpu.nvidia.com'].pcieBusID != "
                            "'0000:11:00.0'")
    s = resource_slice("d1", [mig_device(H100, 0, "7g", 0), gpu_device(H100, 1), gpu_device(H100, 2)])
    v = view([], [], [bare_node("d1")], resource_slices=[s], device_classes=[narrowed])
    inv = v.snapshot.inventory
    assert unusable(inv, "d1") == [((0,), SlotKind.MIG, "7g", 0), ((1,), SlotKind.WHOLE, None, None)]
    assert inv.idle_gpus("d1") == 1
    assert any("gpu-1: not selected by DeviceClass gpu.nvidia.com" in x for x in v.problems)
    assert any("no DeviceClass mig.nvidia.com" in x for x in v.problems)
    # NVIDIA's own classes select every device of its type
    v = view([], [], [bare_node("d1")], resource_slices=[s], device_classes=NVIDIA_CLASSES)
    assert unusable(v.snapshot.inventory, "d1") == [] and not v.problems, v.problems


def test_a_device_class_it_cannot_evaluate_is_said_and_counts_as_selecting_nothing() -> None:
    odd = device_class("gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].type in ['gpu', 'vgpu']")
    v = view([], [], [bare_node("d1")], resource_slices=[node_slice(H100, "d1", plain=2)],
             device_classes=[odd, NVIDIA_CLASSES[1]])
    assert v.snapshot.inventory.idle_gpus("d1") == 0
    assert any(x.startswith("DeviceClass gpu.nvidia.com: selector") and "not understood" in x for x in v.problems)


# -- DeviceTaintRules (alpha) -----------------------------------------------------------------------------------
def taint_rule(name: str, selector: dict | None, effect: str = "NoSchedule") -> dict:
    spec: dict = {"taint": {"key": "example.com/maintenance", "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": spec}


BUS_11 = "device.attributes['gpu.nvidia.com'].pcieBusID == '0000:11:00.0'"


def test_device_taint_rules_taint_the_devices_they_select() -> None:
    s = node_slice(H100, "d1", plain=4)
    rules = [
        taint_rule("one-device", {"driver": "gpu.nvidia.com", "pool": "d1", "device": "gpu-0"}),
        taint_rule("other-pool", {"pool": "d2"}),
        taint_rule("by-cel", {"selectors": [{"cel": {"expression": BUS_11}}]}),
        taint_rule("no-selector", None),  # upstream: without a selector no device is matched
        taint_rule("no-effect", {"device": "gpu-3"}, effect="None"),
        taint_rule("by-class-not-understood", {"deviceClassName": "odd", "device": "gpu-2"}),
    ]
    odd = device_class("odd", "device.attributes['gpu.nvidia.com'].type in ['gpu']")
    dn = read_slices([s], CAT, device_classes=[*NVIDIA_CLASSES, odd], device_taint_rules=rules + rules).nodes["d1"]
    got = {name: d.unusable for name, d in sorted(dn.devices.items())}
    assert got == {"gpu-0": "tainted example.com/maintenance:NoSchedule",
                   "gpu-1": "tainted example.com/maintenance:NoSchedule",
                   # a class it cannot evaluate counts as matching: a taint too many, never one too few
                   "gpu-2": "tainted example.com/maintenance:NoSchedule",
                   "gpu-3": ""}


# -- a model's own claim template naming a class slotwise does not plan for -----------------------------------
def test_a_model_claiming_its_gpu_through_another_device_class_is_said_to_read_as_asking_for_none() -> None:
    from autoscaler.live.kube.translate import build_view

    def rct(name: str, device_class: str) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}]}}}}

    def dep(name: str, template: str, limits: dict) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "ns", "annotations": {"slotwise.io/slo-latency-ms": "500"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}}, "spec": {
                             "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
                             "containers": [{"name": "srv", "resources": {"limits": limits,
                                                                          "claims": [{"name": "dev"}]}}]}}}}

    v = build_view([dep("h100-only", "h100", {"cpu": "2"}), dep("with-nic", "nic", {"nvidia.com/gpu": "1"})], [], [],
                   now=0.0, resource_claim_templates=[rct("h100", "h100.example.com"), rct("nic", "nic.example.com")])
    (line,) = [p for p in v.problems if "claim dev" in p]
    assert line == ("deployment ns/h100-only: claim dev (ResourceClaimTemplate ns/h100) asks for DeviceClass "
                    "'h100.example.com' (slotwise plans slots of gpu.nvidia.com and mig.nvidia.com only): not read "
                    "as a GPU slot, the model reads as asking for no GPU")
