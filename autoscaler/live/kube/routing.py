"""How traffic reaches the activator while a model is at zero: the controller's EndpointSlice. Pure.

A model fronted by a Service (``slotwise.io/service`` on its workload) goes through the activator by one more
EndpointSlice of that Service, written by the controller beside the endpointslice controller's own: named
``<service>-slotwise-activator``, labelled ``kubernetes.io/service-name: <service>`` (so kube-proxy routes the
Service's ClusterIP to its endpoints too), ``endpointslice.kubernetes.io/managed-by: slotwise.io`` (so the
endpointslice controller leaves it alone) and ``slotwise.io/model: <workload name>``; its endpoints are the Ready
activator pods, its one port the Service's first port (same name) at the activator's port 8012. Deleting it sends the
traffic straight to the pods again. Why a slice beside the Service's own and not a selector switch:
docs/scale-to-zero.md.

This module builds the slice (:func:`activator_slice`), finds the activator's endpoints in pods
(:func:`activator_endpoints`), says whether a model goes through the activator now (:func:`via_activator`) and
whether a slice as read already says what it should (:func:`slice_current`). The calls are in
:mod:`~autoscaler.live.kube.actuator`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.api.snapshot import ModelObservation
from autoscaler.live.kube.fields import condition, metadata
from autoscaler.live.kube.objects import (
    ACTIVATOR_PORT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    SERVICE_ANNOTATION,
    SERVICE_NAME_LABEL,
    ManagedModel,
)

SLICE_SUFFIX = "-slotwise-activator"
# Kubernetes names are at most 253 characters (DNS subdomain); a Service name is at most 63, so the suffix fits


def slice_name(service: str) -> str:
    """The name of the controller's activator EndpointSlice of ``service``."""
    return service + SLICE_SUFFIX


@dataclass(frozen=True)
class ActivatorEndpoint:
    """One Ready activator pod: its IP, pod name and node (the slice's endpoint)."""

    ip: str
    pod: str
    namespace: str
    node: str | None = None


def activator_endpoints(pods: Iterable[Mapping[str, Any]]) -> tuple[ActivatorEndpoint, ...]:
    """The Ready, running, not-terminating pods among ``pods`` (the activator's, by the chart's labels) with an
    IP, sorted by IP so the same pods always give the same slice."""
    out = []
    for p in pods:
        meta = metadata(p)
        status = p.get("status") or {}
        ready = condition(p, "Ready")
        ip = status.get("podIP")
        if (meta.get("deletionTimestamp") is None and status.get("phase") == "Running" and ip
                and ready is not None and ready.get("status") == "True"):
            out.append(ActivatorEndpoint(str(ip), str(meta.get("name")), str(meta.get("namespace") or ""),
                                         (p.get("spec") or {}).get("nodeName")))
    return tuple(sorted(out, key=lambda e: (e.ip, e.pod)))


def slice_ports(service: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The slice's one port: the Service's **first** port (its name and protocol) at the activator's port. A
    Service not read (None) or without ports: one unnamed TCP port (what a one-port Service matches).

    Only the first port is fronted: the activator has one listener and cannot tell which Service port a request
    came through, so it forwards everything it gets to the backends' first port. A multi-port Service's other
    ports are left to the pods' own slices (at zero they have no endpoints, exactly as without the activator;
    with pods they go straight there) instead of being sent to the activator and forwarded to the wrong port."""
    ports = [p for p in ((service or {}).get("spec") or {}).get("ports") or [] if isinstance(p, Mapping)]
    out = [{"name": str(p.get("name") or ""), "protocol": str(p.get("protocol") or "TCP"), "port": ACTIVATOR_PORT}
           for p in ports[:1]]
    return out or [{"name": "", "protocol": "TCP", "port": ACTIVATOR_PORT}]


def activator_slice(namespace: str, service: str, model: str, ports: Sequence[Mapping[str, Any]],
                    endpoints: Sequence[ActivatorEndpoint], api_version: str = "discovery.k8s.io/v1",
                    resource_version: str | None = None) -> dict[str, Any]:
    """The EndpointSlice that sends ``service``'s traffic to the activator (``model``: the workload's name).
    ``api_version`` v1beta1 (Kubernetes < 1.21) names the node in ``topology`` instead of ``nodeName``."""
    eps = []
    for e in endpoints:
        ep: dict[str, Any] = {"addresses": [e.ip], "conditions": {"ready": True},
                              "targetRef": {"kind": "Pod", "namespace": e.namespace, "name": e.pod}}
        if e.node:
            if api_version.endswith("/v1beta1"):
                ep["topology"] = {"kubernetes.io/hostname": e.node}
            else:
                ep["nodeName"] = e.node
        eps.append(ep)
    meta: dict[str, Any] = {
        "name": slice_name(service), "namespace": namespace,
        "labels": {SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: MANAGED_BY, MODEL_LABEL: model},
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": api_version, "kind": "EndpointSlice", "metadata": meta, "addressType": "IPv4",
            "endpoints": eps, "ports": [dict(p) for p in ports]}


def _ours(s: Mapping[str, Any], namespace: str, service: str) -> bool:
    meta = metadata(s)
    labels = meta.get("labels") or {}
    return (meta.get("namespace") == namespace and meta.get("name") == slice_name(service)
            and labels.get(MANAGED_BY_LABEL) == MANAGED_BY)


def find_slice(slices: Iterable[Mapping[str, Any]], namespace: str, service: str) -> Mapping[str, Any] | None:
    """The controller's activator slice of ``namespace/service`` among ``slices``, or None."""
    return next((s for s in slices if _ours(s, namespace, service)), None)


def via_activator(slices: Iterable[Mapping[str, Any]], namespace: str, service: str | None) -> bool | None:
    """Whether ``service``'s traffic goes through the activator now: its activator slice exists with endpoints.
    None: the model has no Service (nobody fronts it)."""
    if service is None:
        return None
    s = find_slice(slices, namespace, service)
    return s is not None and bool(s.get("endpoints"))


def slice_current(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """``current`` (as read) already has ``desired``'s labels, endpoints and ports: no write needed."""
    labels = metadata(current).get("labels") or {}
    want = metadata(desired).get("labels") or {}

    def eps(s: Mapping[str, Any]) -> list[tuple]:
        return sorted((tuple(e.get("addresses") or ()), bool((e.get("conditions") or {}).get("ready")))
                      for e in s.get("endpoints") or ())

    def ports(s: Mapping[str, Any]) -> list[tuple]:
        return sorted((str(p.get("name") or ""), str(p.get("protocol") or "TCP"), p.get("port"))
                      for p in s.get("ports") or ())

    return (all(labels.get(k) == v for k, v in want.items()) and eps(current) == eps(desired)
            and ports(current) == ports(desired))


def model_service(meta: Mapping[str, Any]) -> str | None:
    """The Service that fronts a model (``slotwise.io/service`` on its workload), None when absent or blank."""
    name = str((meta.get("annotations") or {}).get(SERVICE_ANNOTATION) or "").strip()
    return name or None


def with_routing(observations: dict[str, ModelObservation], models: Mapping[str, ManagedModel],
                 slices: Iterable[Mapping[str, Any]] | None) -> dict[str, ModelObservation]:
    """Each observation's ``via_activator`` from the activator slices (None: the activator is not enabled, every
    model None)."""
    if slices is None:
        return observations
    slices = list(slices)
    return {k: replace(o, via_activator=via_activator(slices, models[k].namespace, models[k].service))
            if k in models else o for k, o in observations.items()}
