"""Living beside HPA and KEDA (issue 17 item 4), against the REAL kube-apiserver 1.20.2 + etcd (``realparts.kube``).

The HPAs are the server's own ``autoscaling`` API at the version discovery picks (``v2beta2`` on 1.20: ``v2`` is
1.23+). KEDA's ScaledObject is not built in: it is served as a CRD carrying the upstream ``keda.sh/v1alpha1`` schema
(``tests/realparts/keda_crds.yaml``), and since no KEDA operator runs, the test creates the HPA KEDA would create
for it (``keda-hpa-<name>``, owned by the ScaledObject). No controller-manager runs either: nothing but slotwise
could change a ``/scale`` here. The objects are read back from the server the way the informers serve them (a
list, each item stamped with its kind) and go through the real translation (``build_view``) into the actuator.

The examples of docs/kubernetes.md "Living beside HPA and KEDA" are the objects created here (the ScaledObject and
the HPA, moved to the test's namespace and Deployments), and the documented KEDA query is run on a real Prometheus
scraping the exporter's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client
from realparts.crds import crds_installed

from autoscaler.api.plan import Plan, Reason, ScaleModel, SetSlotTemplate, UpdateStatus
from autoscaler.live.exporter import ControllerMetrics
from autoscaler.live.health import Health, bound_port, start_http
from autoscaler.live.kube.actuator import ActuatorConfig, KubeActuator
from autoscaler.live.kube.discovery import AUTOSCALING, KEDA, ServedApis, discover
from autoscaler.live.kube.objects import STATUS_ANNOTATION, ClusterView
from autoscaler.live.kube.translate import build_view

pytest_plugins = ("realparts.kube", "realparts.prometheus")

aio = pytest.mark.asyncio
DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
MIG_3G = "nvidia.com/mig-3g.40gb"
GPU = {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}


def doc_examples() -> dict[str, dict]:
    """The YAML blocks of the docs section, by kind (the adapter rule is keyed ``externalRules``)."""
    text = DOC.read_text()
    section = text.split("## Living beside HPA and KEDA", 1)[1].split("\n## ", 1)[0]
    out = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.S):
        doc = yaml.safe_load(block)
        out[doc.get("kind") or next(iter(doc))] = doc
    return out


@pytest_asyncio.fixture
async def ns(api: client.ApiClient) -> str:
    name = f"slotwise-coexist-{uuid.uuid4().hex[:8]}"
    await client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": name}})
    return name  # no controller-manager: a deleted namespace would sit in Terminating forever, so it is left


async def make_deployment(api: client.ApiClient, ns: str, name: str, replicas: int = 1) -> None:
    labels = {"app": name}
    await client.AppsV1Api(api).create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": {"slotwise.io/slo-latency-ms": "250"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "server", "image": "registry.invalid/vllm:test", "resources": GPU}]}}},
    })


def hpa_body(name: str, target: str, apis: ServedApis) -> dict:
    """The documented HPA (External metric, AverageValue 1), at the autoscaling version the server serves."""
    hpa = doc_examples()["HorizontalPodAutoscaler"]
    hpa["apiVersion"] = apis.group_version(AUTOSCALING)
    hpa["metadata"] = {"name": name}
    hpa["spec"]["scaleTargetRef"]["name"] = target
    hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["name"] = target
    return hpa


async def create(api: client.ApiClient, ns: str, group: str, version: str, plural: str, body: dict) -> dict:
    # CustomObjectsApi addresses any /apis/<group>/<version> collection, built-in ones (autoscaling) included
    return await client.CustomObjectsApi(api).create_namespaced_custom_object(group, version, ns, plural, body)


async def listed(api: client.ApiClient, ns: str, group: str, version: str, plural: str, kind: str) -> list[dict]:
    """A collection as an informer caches it: list items carry no kind, the informer stamps it."""
    got = await client.CustomObjectsApi(api).list_namespaced_custom_object(group, version, ns, plural)
    return [{**item, "kind": kind, "apiVersion": f"{group}/{version}"} for item in got["items"]]


async def read_view(api: client.ApiClient, ns: str, apis: ServedApis) -> ClusterView:
    deps = await client.AppsV1Api(api).list_namespaced_deployment(ns)
    deployments = [{**api.sanitize_for_serialization(d), "kind": "Deployment", "apiVersion": "apps/v1"}
                   for d in deps.items]
    autoscalers = await listed(api, ns, "autoscaling", apis.pick(AUTOSCALING), "horizontalpodautoscalers",
                               "HorizontalPodAutoscaler")
    if apis.pick(KEDA):
        autoscalers += await listed(api, ns, "keda.sh", apis.pick(KEDA), "scaledobjects", "ScaledObject")
    return build_view(deployments, [], [], now=0.0, namespace=ns, autoscalers=autoscalers)


async def replicas(api: client.ApiClient, ns: str, name: str) -> int:
    return (await client.AppsV1Api(api).read_namespaced_deployment_scale(name, ns)).spec.replicas


async def deployment(api: client.ApiClient, ns: str, name: str) -> dict:
    return api.sanitize_for_serialization(await client.AppsV1Api(api).read_namespaced_deployment(name, ns))


async def events(api: client.ApiClient, ns: str, name: str) -> list[dict]:
    got = await client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    return [api.sanitize_for_serialization(e) for e in got.items]


def plan_for(*keys: str, to: int = 3) -> Plan:
    actions: list[Any] = []
    for key in keys:
        actions += [SetSlotTemplate(key, {"limits": {MIG_3G: "1"}}, {}),
                    ScaleModel(key, to, 1, Reason.FORECAST, "forecast 12.5 req/s"),
                    UpdateStatus(key, to, 1, Reason.FORECAST, forecast_rps=12.5, slo_latency_ms=250.0)]
    return Plan(0.0, actions)


@aio
async def test_a_model_an_hpa_scales_is_left_alone_and_says_why(api: client.ApiClient, ns: str) -> None:
    apis = await discover(api)
    assert apis.pick(AUTOSCALING) == "v2beta2"  # what 1.20 serves; v2 by the same discovery from 1.23 on
    await make_deployment(api, ns, "llm-hpa")
    await make_deployment(api, ns, "llm-free")
    hpa = await create(api, ns, "autoscaling", "v2beta2", "horizontalpodautoscalers",
                       hpa_body("llm-hpa", "llm-hpa", apis))
    view = await read_view(api, ns, apis)
    key, free = f"{ns}/llm-hpa", f"{ns}/llm-free"
    assert view.models[key].autoscaled_by == f"HorizontalPodAutoscaler {ns}/llm-hpa"
    assert view.models[free].autoscaled_by is None and not view.problems

    act = KubeActuator(api, ActuatorConfig())  # coexistence: hands-off, the default
    r = await act.apply(plan_for(key, free), view)
    assert not r.errors
    # the model without an autoscaler is scaled and templated: the same plan would have scaled the other one
    assert await replicas(api, ns, "llm-free") == 3
    assert await replicas(api, ns, "llm-hpa") == 1
    assert r.why(f"scale {key}") == ["autoscaled-by"] and r.why(f"template {key}") == ["autoscaled-by"]
    dep = await deployment(api, ns, "llm-hpa")
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"] == GPU  # the template left alone
    status = json.loads(dep["metadata"]["annotations"][STATUS_ANNOTATION])
    assert status["autoscaledBy"] == f"HorizontalPodAutoscaler {ns}/llm-hpa"
    assert status["coexistence"] == "hands-off" and status["desired"] == 3  # what slotwise would set
    said = {e["reason"]: e for e in await events(api, ns, "llm-hpa")}
    assert said["AutoscaledElsewhere"]["type"] == "Warning"
    assert f"HorizontalPodAutoscaler {ns}/llm-hpa scales this Deployment" in said["AutoscaledElsewhere"]["message"]
    assert "not written" in said["Recommended"]["message"] and "Scaled" not in said
    assert "AutoscaledElsewhere" not in {e["reason"] for e in await events(api, ns, "llm-free")}

    # later ticks keep wanting more: still no /scale write, and the Event is not said again
    act.clock = lambda: 1e9
    r = await act.apply(plan_for(key, to=5), await read_view(api, ns, apis))
    assert await replicas(api, ns, "llm-hpa") == 1 and r.why(f"scale {key}") == ["autoscaled-by"]
    told = [e for e in await events(api, ns, "llm-hpa") if e["reason"] == "AutoscaledElsewhere"]
    assert len(told) == 1 and told[0]["count"] == 1
    # slotwise never writes the HPA either
    got = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        "autoscaling", "v2beta2", ns, "horizontalpodautoscalers", "llm-hpa")
    assert got["metadata"]["resourceVersion"] == hpa["metadata"]["resourceVersion"]

    # the HPA goes: slotwise scales the model again
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "autoscaling", "v2beta2", ns, "horizontalpodautoscalers", "llm-hpa")
    view = await read_view(api, ns, apis)
    assert view.models[key].autoscaled_by is None
    await act.apply(plan_for(key), view)
    assert await replicas(api, ns, "llm-hpa") == 3


async def _get(url: str, **params: str) -> str:
    # aiohttp, not urllib: the exporter serves from this test's own event loop, which must keep running
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def _query(prom_url: str, promql: str) -> list[dict]:
    return json.loads(await _get(f"{prom_url}/api/v1/query", query=promql))["data"]["result"]


@aio
async def test_advise_mode_publishes_what_the_hpa_should_set(api: client.ApiClient, ns: str,
                                                             prometheus_factory) -> None:
    apis = await discover(api)
    await make_deployment(api, ns, "llama-70b")
    await create(api, ns, "autoscaling", "v2beta2", "horizontalpodautoscalers",
                 hpa_body("llama-70b", "llama-70b", apis))
    view = await read_view(api, ns, apis)
    key = f"{ns}/llama-70b"
    plan = plan_for(key, to=3)

    act = KubeActuator(api, ActuatorConfig(coexistence="advise"))
    r = await act.apply(plan, view)
    assert not r.errors
    assert await replicas(api, ns, "llama-70b") == 1 and r.why(f"scale {key}") == ["autoscaled-by"]
    dep = await deployment(api, ns, "llama-70b")
    # the slot is slotwise's in advise mode: the advised replicas are sized for it
    assert MIG_3G in dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert json.loads(dep["metadata"]["annotations"][STATUS_ANNOTATION])["coexistence"] == "advise"
    said = {e["reason"]: e for e in await events(api, ns, "llama-70b")}
    selector = f'slotwise_advised_replicas{{namespace="{ns}",kind="Deployment",name="llama-70b"}}'
    assert said["AdvisingAutoscaler"]["type"] == "Normal" and selector in said["AdvisingAutoscaler"]["message"]

    # the exporter, over real HTTP, and a real Prometheus scraping it answering the documented KEDA query
    metrics = ControllerMetrics()
    metrics.set_leader(True)
    metrics.record_advice(plan, view.models, advise=True)
    runner = await start_http(metrics, Health(tick_s=5.0), "127.0.0.1", 0)
    try:
        port = bound_port(runner)
        text = await _get(f"http://127.0.0.1:{port}/metrics")
        assert f'slotwise_advised_replicas{{kind="Deployment",name="llama-70b",namespace="{ns}"}} 3.0' in text
        prom = prometheus_factory(scrape_targets=[(f"127.0.0.1:{port}", {})], scrape_interval_s=1.0)
        keda = doc_examples()["ScaledObject"]["spec"]["triggers"][0]["metadata"]["query"]
        query = keda.replace('namespace="llm"', f'namespace="{ns}"')
        deadline = time.monotonic() + 60
        result: list[dict] = []
        while not result and time.monotonic() < deadline:
            result = await _query(prom.url, query)
            if not result:
                await asyncio.sleep(0.5)  # waiting for the first scrape, not timing anything
        assert [float(s["value"][1]) for s in result] == [3.0]
        # the adapter rule's query, rendered as prometheus-adapter renders it for the HPA above (its namespace and
        # selector as label matchers), answers the same single series
        rule = doc_examples()["externalRules"]["externalRules"][0]
        rendered = rule["metricsQuery"].replace("<<.Series>>", "slotwise_advised_replicas").replace(
            "<<.LabelMatchers>>", f'namespace="{ns}",kind="Deployment",name="llama-70b"')
        assert [float(s["value"][1]) for s in await _query(prom.url, rendered)] == [3.0]
        # a follower's advice is gone: the autoscaler gets no metric and holds (never a 0)
        metrics.set_leader(False)
        assert "slotwise_advised_replicas{" not in await _get(f"http://127.0.0.1:{port}/metrics")
    finally:
        await runner.cleanup()


@aio
async def test_a_scaled_object_and_kedas_own_hpa_leave_the_deployment_alone(api: client.ApiClient, ns: str) -> None:
    async with crds_installed(api, "keda_crds.yaml"):
        apis = await discover(api)
        assert apis.pick(KEDA) == "v1alpha1"
        await make_deployment(api, ns, "llm-keda")
        so = doc_examples()["ScaledObject"]
        so["metadata"] = {"name": "llm-keda"}
        so["spec"]["scaleTargetRef"] = {"name": "llm-keda"}  # kind and apiVersion left to KEDA's defaults
        created = await create(api, ns, "keda.sh", "v1alpha1", "scaledobjects", so)
        # what KEDA's operator would create for it: an HPA on the external metric, owned by the ScaledObject
        keda_hpa = hpa_body("keda-hpa-llm-keda", "llm-keda", apis)
        keda_hpa["metadata"]["ownerReferences"] = [{
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": "llm-keda",
            "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        await create(api, ns, "autoscaling", "v2beta2", "horizontalpodautoscalers", keda_hpa)

        view = await read_view(api, ns, apis)
        key = f"{ns}/llm-keda"
        assert view.models[key].autoscaled_by == f"ScaledObject {ns}/llm-keda"  # once, not also as its HPA
        assert not view.problems
        r = await KubeActuator(api, ActuatorConfig()).apply(plan_for(key), view)
        assert not r.errors and r.why(f"scale {key}") == ["autoscaled-by"]
        assert await replicas(api, ns, "llm-keda") == 1
        said = [e for e in await events(api, ns, "llm-keda") if e["reason"] == "AutoscaledElsewhere"]
        assert len(said) == 1 and f"ScaledObject {ns}/llm-keda scales this Deployment" in said[0]["message"]
