"""The chart's activator (issue 18): absent by default; when enabled, its Deployment (``slotwise activator``, two
replicas, anti-affinity, readiness on /readyz, the admin port scraped), PodDisruptionBudget, a headless Service of
the controller replicas passed as ``--controller-service``, its own ServiceAccount whose RBAC reads EndpointSlices
and nothing else, and the controller's EndpointSlice writes; the rendered settings are what the controller loads."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_chart import CHART_DIR, cluster_rules, load_settings, one, render, role_rules, settings_text

if TYPE_CHECKING:
    from realparts.helm import Helm
    from realparts.kube import KubeApiserver

pytest_plugins = ("realparts.helm", "realparts.kube")
TOKEN_REVIEW = ("authentication.k8s.io", "tokenreviews", "create")
AUDIENCE = "slotwise.io/activations"

ON = ("--set", "activator.enabled=true")


def _activator_docs(docs: list[dict]) -> list[dict]:
    return [d for d in docs if "activator" in d["metadata"]["name"] or d["metadata"]["name"].endswith("-controllers")]


def test_off_by_default(helm: Helm) -> None:
    docs = render(helm)
    assert _activator_docs(docs) == []
    assert not {r for r in cluster_rules(docs) if r[1] in ("endpointslices", "services", "tokenreviews")}
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


def test_the_activator_reports_with_a_projected_token_the_controller_may_review(helm: Helm, tmp_path: Path) -> None:
    """Issue 30: the reports' bearer token is a projected ServiceAccount token for the controller's audience (bound
    to the pod, rotated by the kubelet), passed as --token-file; the controller is told whose token to accept and
    may create TokenReviews -- in the ClusterRole (cluster-scoped) whatever config.namespace, and in a dry run."""
    docs = render(helm, *ON)
    pod = one(docs, "Deployment", "rel-slotwise-activator")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    path = c["args"][c["args"].index("--token-file") + 1]
    [volume] = [v for v in pod["volumes"] if v["name"] == "activation-token"]
    [source] = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == AUDIENCE
    assert source["serviceAccountToken"]["expirationSeconds"] <= 3600
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "activation-token"]
    assert path == f"{mount['mountPath']}/{source['serviceAccountToken']['path']}" and mount["readOnly"]

    settings_file = tmp_path / "config.yaml"
    settings_file.write_text(settings_text(docs))
    settings = load_settings(settings_file)
    assert settings.activator_service_account == pod["serviceAccountName"] == "rel-slotwise-activator"
    assert settings.activator_token_audience == AUDIENCE

    for extra in ((), ("--set", "config.namespace=ml"), ("--set", "config.actuator.dry_run=true")):
        controller = cluster_rules([d for d in render(helm, *ON, *extra) if d["metadata"]["name"] == "rel-slotwise"])
        assert TOKEN_REVIEW in controller, extra
    activator = one(docs, "ClusterRole", "rel-slotwise-activator")
    assert not [r for r in activator["rules"] if "tokenreviews" in r["resources"]]  # the activator reviews nothing
    assert TOKEN_REVIEW not in cluster_rules(render(helm))  # off: not granted


def test_installed_chart_lets_the_controller_review_the_activator_token(helm: Helm, kube_apiserver: KubeApiserver,
                                                                       tmp_path: Path) -> None:
    """helm install (activator on) into the real apiserver: the activator Deployment with its projected token is
    accepted, and the controller's installed ServiceAccount (impersonated) can TokenReview a token of the
    activator's ServiceAccount for the audience -- as the user the rendered settings name; the activator's
    ServiceAccount cannot review."""
    suffix = uuid.uuid4().hex[:6]
    name, ns = f"act-{suffix}", f"slotwise-act-{suffix}"
    values = ("--set", f"config.lease_name=slotwise-{suffix}",  # the GPU Operator's ConfigMap in the release ns
              "--set", f"config.actuator.time_slicing_configmap={ns}/time-slicing-config")
    helm.run("install", name, str(CHART_DIR), "--namespace", ns, "--create-namespace", *ON, *values,
             "--timeout", "60s", kubeconfig=kube_apiserver.kubeconfig, timeout=120, check=True)
    try:
        asyncio.run(_review_as_the_controller(kube_apiserver, ns, f"{name}-slotwise", f"{name}-slotwise-activator"))
    finally:
        helm.run("uninstall", name, "--namespace", ns, kubeconfig=kube_apiserver.kubeconfig, timeout=120)


async def _review_as_the_controller(server: KubeApiserver, ns: str, controller_sa: str, activator_sa: str) -> None:
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client import ApiClient

    async with server.api_client() as admin:
        got = await client.CoreV1Api(admin).create_namespaced_service_account_token(
            activator_sa, ns, {"spec": {"audiences": [AUDIENCE], "expirationSeconds": 3600}})
        token = got.status.token
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token, "audiences": [AUDIENCE]}}

    def as_user(sa: str) -> Any:
        return ApiClient(configuration=server.client_configuration(), header_name="Impersonate-User",
                         header_value=f"system:serviceaccount:{ns}:{sa}")

    async with as_user(controller_sa) as api:
        status = (await client.AuthenticationV1Api(api).create_token_review(review)).status
    assert status.authenticated and status.user.username == f"system:serviceaccount:{ns}:{activator_sa}"
    async with as_user(activator_sa) as api:
        with pytest.raises(client.ApiException) as refused:
            await client.AuthenticationV1Api(api).create_token_review(review)
    assert refused.value.status == 403
