"""Host CPU and memory from the Kubernetes objects (issue 19 item 1): quantities, a pod's requests, a Node's
allocatable as the inventory's host capacity, the template's requests in the model's slot request, and what pods
without a GPU slot hold on the node."""

from __future__ import annotations

import pytest
from test_kube_translate import T0_EPOCH, deployment, gpu_node, pod

from autoscaler.api.spec import slot_request
from autoscaler.live.kube.gpu_nodes import cpu_millis, memory_gib, pod_host_requests
from autoscaler.live.kube.translate import build_view
from sharing.packer import CostAwarePacker


@pytest.mark.parametrize(("text", "millis"), [("500m", 500), ("2", 2000), ("0.1", 100), ("1.0005", 1001), (3, 3000),
                                              ("1k", 1_000_000), ("2e-3", 2), ("100u", 1)])
def test_cpu_quantities(text, millis: int) -> None:
    assert cpu_millis(text, "cpu") == millis  # rounded up to a millicore, as Kubernetes does


@pytest.mark.parametrize(("text", "gib"), [("16Gi", 16.0), ("512Mi", 0.5), ("1G", 1e9 / 2**30),
                                           ("1073741824", 1.0), ("1Ti", 1024.0), ("1e9", 1e9 / 2**30)])
def test_memory_quantities(text: str, gib: float) -> None:
    assert memory_gib(text, "memory") == pytest.approx(gib)


@pytest.mark.parametrize("bad", ["abc", "1Gb", "-1", "", "1.2.3", True, "Gi", "1e999999", "1e999999999", "9Ei"])
def test_a_bad_quantity_names_its_field(bad) -> None:
    with pytest.raises(ValueError, match=r"spec\.containers\[0\]\.resources\.requests\.cpu"):
        pod_host_requests({"containers": [{"resources": {"requests": {"cpu": bad}}}]})


def test_pod_requests_as_the_scheduler_counts_them() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "500m", "memory": "2Gi"}}},
                           {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],  # a limit stands for a request
            "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
            "overhead": {"memory": "512Mi"}}
    assert pod_host_requests(spec) == (4000, 3.5)
    assert pod_host_requests({}) == (0, 0.0)


def test_sidecars_add_up_as_the_scheduler_counts_them() -> None:
    # KEP-753: a restartable init container (a sidecar) keeps running, so its requests add to the containers' and
    # to every init container started after it: max(1 + 1, 1 + 3) + 0.25 overhead.
    spec = {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                               {"resources": {"requests": {"cpu": "3"}}}],
            "overhead": {"cpu": "250m"}}
    assert pod_host_requests(spec) == (4250, 1.0)


def test_the_pods_cache_keeps_what_the_host_requests_need() -> None:
    from autoscaler.live.kube.pods import slim_pod

    full = {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}],
                     "initContainers": [{"name": "s", "restartPolicy": "Always",
                                         "resources": {"requests": {"cpu": "1"}}}],
                     "overhead": {"cpu": "250m"}}}
    assert pod_host_requests(slim_pod(full)["spec"]) == pod_host_requests(full["spec"]) == (2250, 0.0)


def test_allocatable_template_requests_and_pods_without_slots() -> None:
    node = gpu_node("gpu-1", count=8)
    node["status"]["allocatable"].update({"cpu": "32", "memory": "256Gi"})
    dep = deployment("llm", resources={"limits": {"nvidia.com/gpu": "1"},
                                       "requests": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"}})
    gpu_pod = pod("llm-1", "llm", gpus={"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"})
    cpu_pod = pod("etl-1", "etl", gpus={"cpu": "20", "memory": "64Gi"})
    view = build_view([dep], [gpu_pod, cpu_pod], [node], now=T0_EPOCH)
    inv = view.snapshot.inventory
    spec = inv.nodes["gpu-1"]
    assert (spec.cpu_millis, spec.host_memory_gib) == (32000, 256.0)
    assert inv.host_used("gpu-1") == (24000, 96.0)  # the replica's slot and the CPU-only pod's hold
    assert inv.host_held("gpu-1") == (20000, 64.0)
    ((_, slot),) = list(inv.allocations())
    assert (slot.cpu_millis, slot.host_memory_gib) == (4000, 32.0)
    model = view.snapshot.models["ml/llm"]
    assert model.spec is not None and (model.spec.cpu_millis, model.spec.host_memory_gib) == (4000, 32.0)
    req = slot_request(model.spec)
    assert (req.cpu_millis, req.host_memory_gib) == (4000, 32.0)
    # 8 CPUs left on the node: two more replicas fit, the next is refused for CPU whatever the free GPUs
    work = inv.copy()
    first = CostAwarePacker().place(work, req)
    assert first is not None
    work.allocate(first, "ml/llm-9")
    second = CostAwarePacker().place(work, req)
    assert second is not None  # 4 CPUs still left
    work.allocate(second, "ml/llm-10")
    assert CostAwarePacker().place(work, req) is None


def test_a_malformed_template_or_allocatable_is_a_problem_naming_the_field() -> None:
    node = gpu_node("gpu-1", count=2)
    node["status"]["allocatable"]["cpu"] = "lots"
    dep = deployment("llm", resources={"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "four"}})
    view = build_view([dep], [], [node], now=T0_EPOCH)
    assert any("status.allocatable.cpu" in p and "'lots'" in p for p in view.problems), view.problems
    assert any("spec.template.spec.containers[0].resources.requests.cpu" in p for p in view.problems), view.problems
    assert view.snapshot.inventory.nodes["gpu-1"].cpu_millis is None  # not accounted, nothing refused for it
