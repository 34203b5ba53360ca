"""A LeaderWorkerSet's group size, read from the workload (``spec.leaderWorkerTemplate.size`` -> the spec's
``pods_per_replica``, ``translate.py``), meets the admission caps (``limits.max_pods_per_replica``, and size x
gpus-per-replica <= ``limits.max_gpus_per_replica``): admission runs on the translated spec, so a workload of 800
pods per group is refused alone, naming its group size (issue 17). Pure: the API's dicts, as test_workloads.py."""

from __future__ import annotations

from test_kube_translate import deployment, view
from test_workloads import NODES, lws

from autoscaler.api.spec import PODS_PER_REPLICA_KEY, SpecLimits
from autoscaler.decision.admission import admit
from autoscaler.decision.arbitration import ArbitrationPolicy


def test_a_leaderworkerset_of_huge_groups_is_refused_alone() -> None:
    v = view([deployment("small")], [], NODES,
             workloads=[lws("huge", replicas=0, size=800), lws("fine", replicas=0, size=4)])
    assert v.snapshot.models["ml/huge"].spec is not None  # the translation parses it; the caps are admission's
    admitted = admit(v.snapshot, SpecLimits(), ArbitrationPolicy())
    huge = admitted.models["ml/huge"]
    assert huge.spec is None and huge.spec_error is not None
    (problem,) = huge.spec_error.problems
    assert problem.key == PODS_PER_REPLICA_KEY and "limits.max_pods_per_replica (64)" in problem.reason
    assert admitted.models["ml/fine"].spec is not None and admitted.models["ml/fine"].spec.pods_per_replica == 4
    assert admitted.models["ml/small"].spec is not None


def test_a_group_of_eight_gpu_pods_is_bounded_by_its_gpus() -> None:
    """size 9 x gpus-per-replica 8 = 72 GPUs per replica: over limits.max_gpus_per_replica (64)."""
    v = view([], [], NODES, workloads=[lws("wide", replicas=0, size=9)])
    (problem,) = admit(v.snapshot, SpecLimits(), ArbitrationPolicy()).models["ml/wide"].spec_error.problems
    assert problem.key == PODS_PER_REPLICA_KEY and "72 GPUs" in problem.reason
    assert admit(v.snapshot, SpecLimits(max_gpus_per_replica=72), ArbitrationPolicy()).models["ml/wide"].spec
