"""How traffic reaches the activator while a model is at zero: the controller's EndpointSlice. Pure.

A model fronted by a Service (``slotwise.io/service`` on its workload) goes through the activator by one more
EndpointSlice of that Service, written by the controller beside the endpointslice controller's own: named
``<service>-slotwise-activator``, labelled ``kubernetes.io/service-name: <service>`` (so kube-proxy routes the
Service's ClusterIP to its endpoints too), ``endpointslice.kubernetes.io/managed-by: slotwise.io`` (so the
endpointslice controller leaves it alone) and ``slotwise.io/model: <workload name>``; its endpoints are the Ready
activator pods, its ports every TCP port of the Service (same names), the i-th at the activator's port 8012 + i (the
activator listens on each, so it knows which Service port a request came through). One slice per IP family of the
Service (``spec.ipFamilies``; a slice has one ``addressType``): ``<service>-slotwise-activator`` for IPv4,
``<service>-slotwise-activator-ipv6`` for IPv6, each with the activator pods' addresses of that family (their
``status.podIPs``). Deleting them sends the traffic straight to the pods again. Why a slice beside the Service's
own and not a selector switch: docs/scale-to-zero.md.

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
# Kubernetes names are at most 253 characters (DNS subdomain); a Service name is at most 63, so the suffixes fit
IPV4, IPV6 = "IPv4", "IPv6"  # EndpointSlice addressType = Service ipFamilies values
FAMILIES = (IPV4, IPV6)
# The activator listens on ACTIVATOR_PORT .. ACTIVATOR_PORT + ACTIVATOR_PORT_COUNT - 1: the i-th fronted Service
# port is sent to ACTIVATOR_PORT + i (the contract with `slotwise activator --port-count`). A Service with more TCP
# ports has the first ACTIVATOR_PORT_COUNT fronted; the rest go to its pods' slices only.
ACTIVATOR_PORT_COUNT = 16


def slice_name(service: str, family: str = IPV4) -> str:
    """The name of the controller's activator EndpointSlice of ``service`` for one IP family (IPv4 keeps the name
    of the single-stack slice, so slices written before dual-stack support are the same objects)."""
    return service + SLICE_SUFFIX + ("-ipv6" if family == IPV6 else "")


def address_family(ip: str) -> str:
    """``IPv6`` for an address with a colon, else ``IPv4`` (pod IPs are always one or the other)."""
    return IPV6 if ":" in ip else IPV4


@dataclass(frozen=True)
class ActivatorEndpoint:
    """One Ready activator pod: its (primary) IP, pod name and node, and all its IPs (one per family on a
    dual-stack cluster: ``status.podIPs``) -- the slices' endpoint."""

    ip: str
    pod: str
    namespace: str
    node: str | None = None
    ips: tuple[str, ...] = ()

    def address(self, family: str) -> str | None:
        """The pod's address of ``family`` (None: it has none)."""
        return next((i for i in (self.ips or (self.ip,)) if address_family(i) == family), None)


def pod_ips(status: Mapping[str, Any]) -> tuple[str, ...]:
    """A pod's IPs: ``status.podIPs`` (dual-stack: one per family), else ``status.podIP``; the primary first."""
    ips = [str(i.get("ip")) for i in status.get("podIPs") or () if isinstance(i, Mapping) and i.get("ip")]
    primary = status.get("podIP")
    if primary and str(primary) not in ips:
        ips.insert(0, str(primary))
    return tuple(ips)


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
                                         (p.get("spec") or {}).get("nodeName"), pod_ips(status)))
    return tuple(sorted(out, key=lambda e: (e.ip, e.pod)))


def slice_ports(service: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The slice's ports: every TCP port of the Service (its name), the i-th at the activator's port
    ``ACTIVATOR_PORT + i`` (at most ``ACTIVATOR_PORT_COUNT``). A Service not read (None) or without a TCP port:
    one unnamed TCP port (what a one-port Service matches).

    One activator port per Service port because a request forwarded by kube-proxy carries no trace of the Service
    port it came through but its destination port: the activator tells them apart by the listener that got it and
    forwards to the backends' port of the same name. Other protocols (UDP, SCTP) are not HTTP: left to the pods'
    own slices, as are ports beyond the activator's count."""
    ports = [p for p in ((service or {}).get("spec") or {}).get("ports") or [] if isinstance(p, Mapping)]
    tcp = [p for p in ports if str(p.get("protocol") or "TCP") == "TCP"][:ACTIVATOR_PORT_COUNT]
    out = [{"name": str(p.get("name") or ""), "protocol": "TCP", "port": ACTIVATOR_PORT + i}
           for i, p in enumerate(tcp)]
    return out or [{"name": "", "protocol": "TCP", "port": ACTIVATOR_PORT}]


def service_families(service: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The IP families the Service is reachable on: ``spec.ipFamilies`` (dual-stack clusters set it on every
    Service), else the families of its cluster IPs, else IPv4 (a single-stack cluster before 1.20)."""
    spec = (service or {}).get("spec") or {}
    families = [f for f in spec.get("ipFamilies") or () if f in FAMILIES]
    if not families:
        ips = [i for i in [*(spec.get("clusterIPs") or ()), spec.get("clusterIP")] if i and i != "None"]
        families = [address_family(str(i)) for i in ips]
    return tuple(dict.fromkeys(families)) or (IPV4,)


def activator_slice(namespace: str, service: str, model: str, ports: Sequence[Mapping[str, Any]],
                    endpoints: Sequence[ActivatorEndpoint], api_version: str = "discovery.k8s.io/v1",
                    resource_version: str | None = None, family: str = IPV4) -> dict[str, Any]:
    """The EndpointSlice that sends ``service``'s traffic of one IP ``family`` to the activator (``model``: the
    workload's name): the activator pods' addresses of that family. ``api_version`` v1beta1 (Kubernetes < 1.21)
    names the node in ``topology`` instead of ``nodeName``."""
    eps = []
    for e in endpoints:
        address = e.address(family)
        if address is None:
            continue
        ep: dict[str, Any] = {"addresses": [address], "conditions": {"ready": True},
                              "targetRef": {"kind": "Pod", "namespace": e.namespace, "name": e.pod}}
        if e.node:
            if api_version.endswith("/v1beta1"):
                ep["topology"] = {"kubernetes.io/hostname": e.node}
            else:
                ep["nodeName"] = e.node
        eps.append(ep)
    meta: dict[str, Any] = {
        "name": slice_name(service, family), "namespace": namespace,
        "labels": {SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: MANAGED_BY, MODEL_LABEL: model},
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": api_version, "kind": "EndpointSlice", "metadata": meta, "addressType": family,
            "endpoints": eps, "ports": [dict(p) for p in ports]}


def _ours(s: Mapping[str, Any], namespace: str, service: str, families: Sequence[str] = FAMILIES) -> bool:
    meta = metadata(s)
    labels = meta.get("labels") or {}
    return (meta.get("namespace") == namespace and meta.get("name") in {slice_name(service, f) for f in families}
            and labels.get(MANAGED_BY_LABEL) == MANAGED_BY)


def find_slice(slices: Iterable[Mapping[str, Any]], namespace: str, service: str,
               family: str = IPV4) -> Mapping[str, Any] | None:
    """The controller's activator slice of ``namespace/service`` for ``family`` among ``slices``, or None."""
    return next((s for s in slices if _ours(s, namespace, service, (family,))), None)


def via_activator(slices: Iterable[Mapping[str, Any]], namespace: str, service: str | None) -> bool | None:
    """Whether ``service``'s traffic goes through the activator now: an activator slice of it (any family) exists
    with endpoints. None: the model has no Service (nobody fronts it). A dual-stack Service with one family's
    slice only reads True too: the routing write before a scale to zero writes every family or fails (then the
    scale to zero is not written)."""
    if service is None:
        return None
    return any(_ours(s, namespace, service) and bool(s.get("endpoints")) for s in slices)


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
            and ports(current) == ports(desired)
            and (current.get("addressType") or IPV4) == (desired.get("addressType") or IPV4))


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
