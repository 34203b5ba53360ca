"""Which managed models an HPA or a KEDA ScaledObject scales (autoscaler/live/kube/autoscalers.py), pure: the kinds and
versions, KEDA's defaults and its own HPA, namespaces, targets that are no model, and build_view's hook."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoscaler.live.kube.autoscalers import Autoscaler, autoscalers_by_target, mark_autoscaled, read_autoscaler
from autoscaler.live.kube.objects import ManagedModel
from autoscaler.live.kube.translate import build_view


def _model(ns: str, name: str, kind: str = "Deployment") -> ManagedModel:
    return ManagedModel(key=f"{ns}/{name}", namespace=ns, name=name, uid="u", replicas=1, container="c", kind=kind)


def hpa(ns: str, name: str, target: str, kind: str = "Deployment", version: str = "autoscaling/v2",
        owner: str | None = None) -> dict:
    meta: dict = {"namespace": ns, "name": name}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": owner,
                                    "uid": "so-uid", "controller": True}]
    return {"apiVersion": version, "kind": "HorizontalPodAutoscaler", "metadata": meta,
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target},
                     "minReplicas": 1, "maxReplicas": 10}}


def scaled_object(ns: str, name: str, target: str, kind: str | None = None) -> dict:
    ref: dict = {"name": target}
    if kind is not None:
        ref["kind"] = kind
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"namespace": ns, "name": name},
            "spec": {"scaleTargetRef": ref, "triggers": [{"type": "prometheus", "metadata": {"threshold": "1"}}]}}


MODELS = {m.key: m for m in (_model("llm", "a"), _model("llm", "b"), _model("other", "a"),
                             _model("llm", "lws", "LeaderWorkerSet"))}


def _by(objs: list[dict]) -> tuple[dict[str, str | None], list[str]]:
    problems: list[str] = []
    marked = mark_autoscaled(MODELS, objs, problems)
    return {k: m.autoscaled_by for k, m in marked.items()}, problems


def test_every_hpa_version_shares_scale_target_ref() -> None:
    for version in ("autoscaling/v1", "autoscaling/v2beta2", "autoscaling/v2"):
        assert _by([hpa("llm", "h", "a", version=version)]) == ({"llm/a": "HorizontalPodAutoscaler llm/h"}, [])


def test_a_scaled_object_defaults_to_a_deployment_and_a_kind_it_names() -> None:
    assert _by([scaled_object("llm", "so", "b")]) == ({"llm/b": "ScaledObject llm/so"}, [])
    assert _by([scaled_object("llm", "so", "lws", kind="LeaderWorkerSet")]) == (
        {"llm/lws": "ScaledObject llm/so"}, [])
    # an HPA needs the kind: the API makes it required, so one without it is read as broken, not as a Deployment
    bad = hpa("llm", "h", "a")
    del bad["spec"]["scaleTargetRef"]["kind"]
    assert _by([bad]) == ({}, ["HorizontalPodAutoscaler llm/h: no spec.scaleTargetRef.kind; ignored"])


def test_kedas_own_hpa_is_its_scaled_object_not_a_second_autoscaler() -> None:
    so = scaled_object("llm", "so", "b")
    # owned (what KEDA creates), named keda-hpa-<so> (an owner stripped by a restore), or a custom name, owned
    for keda_hpa in (hpa("llm", "keda-hpa-so", "b", owner="so"), hpa("llm", "keda-hpa-so", "b"),
                     hpa("llm", "custom-name", "b", owner="so")):
        assert _by([so, keda_hpa]) == ({"llm/b": "ScaledObject llm/so"}, [])
    # the ScaledObjects not watched (no KEDA RBAC): KEDA's HPA still names its ScaledObject
    assert _by([hpa("llm", "keda-hpa-so", "b", owner="so")]) == ({"llm/b": "ScaledObject llm/so"}, [])
    # a user's own HPA that merely starts with the prefix, on another target, is an HPA
    assert _by([so, hpa("llm", "keda-hpa-so", "a")]) == (
        {"llm/a": "HorizontalPodAutoscaler llm/keda-hpa-so", "llm/b": "ScaledObject llm/so"}, [])


def test_targets_match_by_namespace_kind_and_name() -> None:
    # another namespace, another kind, a workload that is no model: nobody's autoscaler
    objs = [hpa("default", "h", "a"), hpa("llm", "h2", "a", kind="StatefulSet"), hpa("llm", "h3", "unmanaged"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "llm", "name": "a"}}]
    assert _by(objs) == ({}, [])
    assert _by([hpa("other", "h", "a")]) == ({"other/a": "HorizontalPodAutoscaler other/h"}, [])
    # the reference's API group is not compared (an old extensions/v1beta1 reference still names the workload)
    old = hpa("llm", "h", "a")
    old["spec"]["scaleTargetRef"]["apiVersion"] = "extensions/v1beta1"
    assert _by([old]) == ({"llm/a": "HorizontalPodAutoscaler llm/h"}, [])


def test_two_autoscalers_on_one_workload_are_both_named_with_a_problem_line() -> None:
    got, problems = _by([hpa("llm", "h", "a"), scaled_object("llm", "so", "a")])
    assert got == {"llm/a": "HorizontalPodAutoscaler llm/h, ScaledObject llm/so"}
    assert problems == ["deployment llm/a: scaled by several autoscalers (HorizontalPodAutoscaler llm/h, "
                        "ScaledObject llm/so); they fight each other"]


def test_unreadable_targets_are_problem_lines() -> None:
    assert read_autoscaler({"kind": "HorizontalPodAutoscaler", "metadata": {"namespace": "n", "name": "h"},
                            "spec": {}}) == "HorizontalPodAutoscaler n/h: no spec.scaleTargetRef.name; ignored"
    assert read_autoscaler({"kind": "Pod"}) is None
    assert read_autoscaler(hpa("n", "h", "t")) == Autoscaler("HorizontalPodAutoscaler", "n", "h", "Deployment", "t")


_objs = st.lists(st.one_of(
    st.builds(hpa, st.sampled_from(["llm", "other"]), st.sampled_from(["h1", "keda-hpa-so", "h2"]),
              st.sampled_from(["a", "b", "lws", "x"]), st.sampled_from(["Deployment", "LeaderWorkerSet"]),
              owner=st.sampled_from([None, "so"])),
    st.builds(scaled_object, st.sampled_from(["llm", "other"]), st.sampled_from(["so", "so2"]),
              st.sampled_from(["a", "b", "lws", "x"]), st.sampled_from([None, "Deployment", "LeaderWorkerSet"])),
), max_size=8)


@given(_objs, st.randoms(use_true_random=False))
def test_the_result_does_not_depend_on_the_informers_order(objs: list[dict], rnd) -> None:
    shuffled = list(objs)
    rnd.shuffle(shuffled)
    assert _by(objs) == _by(shuffled)
    # every model marked is a target of something given, and only models are marked
    targets = autoscalers_by_target(objs, [])
    for key in _by(objs)[0]:
        m = MODELS[key]
        assert (m.namespace, m.kind, m.name) in targets


def test_build_view_marks_the_models_its_autoscalers_target() -> None:
    def dep(name: str) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"namespace": "llm", "name": name, "uid": name,
                             "annotations": {"slotwise.io/slo-latency-ms": "250"}},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                         "template": {"spec": {"containers": [{"name": "c"}]}}}}

    view = build_view([dep("a"), dep("b"), dep("c")], [], [], now=0.0,
                      autoscalers=[hpa("llm", "h", "a", version="autoscaling/v2beta2"), scaled_object("llm", "so", "b"),
                                   hpa("llm", "keda-hpa-so", "b", owner="so")])
    assert {k: m.autoscaled_by for k, m in view.models.items()} == {
        "llm/a": "HorizontalPodAutoscaler llm/h", "llm/b": "ScaledObject llm/so", "llm/c": None}
    assert not view.problems
