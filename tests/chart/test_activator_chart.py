"""The chart's activator (issue 18): absent by default; when enabled, its Deployment (``slotwise activator``, two
replicas, anti-affinity, readiness on /readyz, the admin port scraped), PodDisruptionBudget, a headless Service of
the controller replicas passed as ``--controller-service``, its own ServiceAccount whose RBAC reads EndpointSlices
and nothing else, and the controller's EndpointSlice writes; the rendered settings are what the controller loads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from test_chart import cluster_rules, load_settings, one, render, role_rules, settings_text

if TYPE_CHECKING:
    from realparts.helm import Helm

pytest_plugins = ("realparts.helm",)

ON = ("--set", "activator.enabled=true")


def _activator_docs(docs: list[dict]) -> list[dict]:
    return [d for d in docs if "activator" in d["metadata"]["name"] or d["metadata"]["name"].endswith("-controllers")]


def test_off_by_default(helm: Helm) -> None:
    docs = render(helm)
    assert _activator_docs(docs) == []
    assert not {r for r in cluster_rules(docs) if r[1] in ("endpointslices", "services")}
    assert "activator" not in settings_text(docs)


def test_enabled_renders_an_ha_activator_with_read_only_rbac(helm: Helm, tmp_path: Path) -> None:
    docs = render(helm, *ON)
    dep = one(docs, "Deployment", "rel-slotwise-activator")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["slotwise"] and c["args"][0] == "activator"
    assert c["args"][c["args"].index("--controller-service") + 1] == \
        "rel-slotwise-controllers.slotwise-system.svc:8080"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert {p["containerPort"] for p in c["ports"]} == {8012, 9090}
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert pod["affinity"]["podAntiAffinity"]
    # a deleted pod keeps its listener open until the controller's slices (next tick) and kube-proxy dropped it,
    # then drains every held request's full hold: the grace period covers both
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep >= 2 * 5 + 5  # config.tick_s 5
    drain = float(c["args"][c["args"].index("--drain-timeout-s") + 1])
    assert drain >= float(c["args"][c["args"].index("--hold-timeout-s") + 1])
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain
    slow = one(render(helm, *ON, "--set", "config.tick_s=30"), "Deployment", "rel-slotwise-activator")
    assert int(slow["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1]) \
        >= 60
    assert pod["serviceAccountName"] == "rel-slotwise-activator"
    # the controller Deployment's selector must not take the activator's pods
    ctl = one(docs, "Deployment", "rel-slotwise")["spec"]["selector"]["matchLabels"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in ctl.items())
    assert one(docs, "PodDisruptionBudget", "rel-slotwise-activator")["spec"]["minAvailable"] == 1
    svc = one(docs, "Service", "rel-slotwise-controllers")
    assert svc["spec"]["clusterIP"] == "None"

    role = one(docs, "ClusterRole", "rel-slotwise-activator")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")}
    binding = one(docs, "ClusterRoleBinding", "rel-slotwise-activator")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-slotwise-activator",
                                    "namespace": "slotwise-system"}]

    controller = {r for r in cluster_rules([d for d in docs if d["metadata"]["name"] == "rel-slotwise"])}
    assert {v for g, r, v in controller if r == "endpointslices"} == {"get", "list", "watch", "create", "update",
                                                                       "delete"}  # no patch: never used
    assert {v for g, r, v in controller if r == "services"} == {"get"}

    path = tmp_path / "config.yaml"
    path.write_text(settings_text(docs))
    settings = load_settings(path)
    assert settings.activator_enabled and settings.activator_namespace == "slotwise-system"
    selector = dict(kv.split("=") for kv in settings.activator_selector.split(","))
    assert all(labels[k] == v for k, v in selector.items())


def test_dry_run_grants_the_controller_no_slice_writes(helm: Helm) -> None:
    docs = render(helm, *ON, "--set", "config.actuator.dry_run=true")
    controller = cluster_rules([d for d in docs if d["metadata"]["name"] == "rel-slotwise"])
    assert {v for g, r, v in controller if r == "endpointslices"} == {"get", "list", "watch"}


def test_namespaced_mode_grants_the_routing_in_the_model_namespace_only(helm: Helm) -> None:
    docs = render(helm, *ON, "--set", "config.namespace=ml")
    controller = cluster_rules([d for d in docs if d["metadata"]["name"] == "rel-slotwise"])
    assert not {r for r in controller if r[1] in ("endpointslices", "services")}, controller
    models = role_rules(docs, "ml", "rel-slotwise-models")
    assert {v for g, r, v in models if (g, r) == ("discovery.k8s.io", "endpointslices")} == \
        {"get", "list", "watch", "create", "update", "delete"}
    assert {v for g, r, v in models if (g, r) == ("", "services")} == {"get"}
    # without the activator, no routing rules anywhere
    off = render(helm, "--set", "config.namespace=ml")
    assert not {r for r in role_rules(off, "ml", "rel-slotwise-models") if r[1] in ("endpointslices", "services")}
