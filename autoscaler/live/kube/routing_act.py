"""The calls behind ``SetRouting`` (issue 18): the controller's activator EndpointSlice of a model's Service.

``via_activator`` True creates or updates ``<service>-slotwise-activator`` (its body from
:func:`~autoscaler.live.kube.routing.activator_slice`: the Ready activator pods as endpoints, the Service's first
port at 8012); False deletes it. A planned route with no Ready activator pod is a failed write
(:class:`NoActivator`): a slice without endpoints would send the model's traffic nowhere once it is at zero.

:meth:`RoutingActuation.in_step` keeps the slices of models already going through the activator in step with the
activator's pods without asking the apiserver: it compares the slice the controller's informer holds with the one
the activator-pods informer and the cached Service port give, so a tick with hundreds of models at zero does no
reads for them; only a difference costs the reads and the write of :meth:`RoutingActuation.route`. Every write
passes the tick's write gate right before it is made. The ordering against scaling (routing before a scale to
zero, no scale to zero after a failed routing write, the reconciles after the scale writes) is the actuator's
(:meth:`~autoscaler.live.kube.actuator.KubeActuator.apply`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.live.kube.objects import ManagedModel
from autoscaler.live.kube.routing import (
    activator_endpoints,
    activator_slice,
    find_slice,
    slice_current,
    slice_name,
    slice_ports,
)
from autoscaler.live.kube.term import WriteGate

Retrying = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]

PORTS_TTL_S = 300.0  # a Service's port read this long ago is read again (a renamed port reaches the slice)


class NoService(Exception):
    """The model's ``slotwise.io/service`` names no Service in its namespace: nothing to route."""


class NoActivator(Exception):
    """No Ready activator pod: a slice now would have no endpoints, the model's traffic nowhere to go."""


class RoutingActuation:
    """Writes and deletes the activator EndpointSlices. ``activator_pods()`` lists the activator's pods (the
    controller's informer of them); ``slices()`` the controller's activator slices as its informer holds them
    (None: not watched, every reconcile reads); ``api_version`` is the discovered ``discovery.k8s.io`` version."""

    def __init__(self, api_client: Any, activator_pods: Callable[[], Iterable[Mapping[str, Any]]] = list,
                 api_version: str = "discovery.k8s.io/v1", *, clock: Callable[[], float] = time.monotonic) -> None:
        self._core = CoreV1Api(api_client)
        self._objects = CustomObjectsApi(api_client)
        self.activator_pods = activator_pods
        self.slices: Callable[[], Iterable[Mapping[str, Any]]] | None = None
        self.api_version = api_version
        self.clock = clock
        self._ports: dict[tuple[str, str], tuple[float, list[dict[str, Any]]]] = {}  # (ns, svc) -> (read at, ports)
        self.reads = 0  # Service and slice GETs made (a reconcile in step makes none)

    @property
    def _gv(self) -> tuple[str, str]:
        group, _, version = self.api_version.partition("/")
        return group, version

    async def ports(self, mm: ManagedModel, *, fresh: bool = False) -> list[dict[str, Any]]:
        """The slice's ports from the model's Service, cached ``PORTS_TTL_S`` (``fresh``: read it now)."""
        assert mm.service is not None
        key = (mm.namespace, mm.service)
        cached = self._ports.get(key)
        if cached is not None and not fresh and self.clock() - cached[0] < PORTS_TTL_S:
            return cached[1]
        self.reads += 1
        try:
            svc = await self._core.read_namespaced_service(mm.service, mm.namespace)
        except ApiException as e:
            if e.status == 404:
                self._ports.pop(key, None)
                why = f"{mm.key}: Service {mm.namespace}/{mm.service} (slotwise.io/service) not found"
                raise NoService(why) from None
            raise
        ports = slice_ports(self._core.api_client.sanitize_for_serialization(svc))
        self._ports[key] = (self.clock(), ports)
        return ports

    def _want(self, mm: ManagedModel, ports: list[dict[str, Any]], *, allow_empty: bool) -> dict[str, Any]:
        endpoints = activator_endpoints(self.activator_pods())
        if not endpoints and not allow_empty:
            raise NoActivator(f"{mm.key}: no Ready activator pod to route Service {mm.namespace}/{mm.service} to "
                              "(is the activator running?); not routed, so not scaled to zero")
        return activator_slice(mm.namespace, mm.service or "", mm.name, ports, endpoints, self.api_version)

    async def desired(self, mm: ManagedModel, *, allow_empty: bool = False, fresh: bool = True) -> dict[str, Any]:
        return self._want(mm, await self.ports(mm, fresh=fresh), allow_empty=allow_empty)

    def in_step(self, mm: ManagedModel) -> bool | None:
        """Whether the model's slice as the informer holds it already says what it should (True: nothing to do),
        from memory only. None: not answerable without a read (no informer, or the Service's ports not cached)."""
        if self.slices is None or mm.service is None:
            return None
        cached = self._ports.get((mm.namespace, mm.service))
        if cached is None or self.clock() - cached[0] >= PORTS_TTL_S:
            return None
        have = find_slice(self.slices(), mm.namespace, mm.service)
        return have is not None and slice_current(have, self._want(mm, cached[1], allow_empty=True))

    async def route(self, mm: ManagedModel, gate: WriteGate, retrying: Retrying, *, reconcile: bool = False) -> str:
        """Traffic through the activator: create or update the slice. Answers what was done ("created",
        "updated", "unchanged"). Raises on failure (the caller then must not scale the model to zero), also
        :class:`NoActivator` when no activator pod is Ready -- except for a ``reconcile`` of a slice already
        there, which then is emptied (its pods are gone: their IPs must not keep the Service's traffic)."""
        group, version = self._gv
        name = slice_name(mm.service or "")

        async def attempt() -> str:
            want = await self.desired(mm, allow_empty=reconcile, fresh=not reconcile)
            self.reads += 1
            try:
                have = await self._objects.get_namespaced_custom_object(group, version, mm.namespace,
                                                                        "endpointslices", name)
            except ApiException as e:
                if e.status != 404:
                    raise
                have = None
            if have is not None and slice_current(have, want):
                return "unchanged"
            if have is None and not want["endpoints"]:
                raise NoActivator(f"{mm.key}: no Ready activator pod; no slice written")
            gate.check(f"EndpointSlice {mm.namespace}/{name}")
            if have is None:
                await self._objects.create_namespaced_custom_object(group, version, mm.namespace, "endpointslices",
                                                                    want)
                return "created"
            want["metadata"]["resourceVersion"] = (have.get("metadata") or {}).get("resourceVersion")
            await self._objects.replace_namespaced_custom_object(group, version, mm.namespace, "endpointslices",
                                                                 name, want)
            return "updated"

        return await retrying(attempt)

    async def unroute(self, mm: ManagedModel, gate: WriteGate) -> str:
        """Traffic straight to the pods: delete the slice ("deleted", or "unchanged" when there was none)."""
        group, version = self._gv
        name = slice_name(mm.service or "")
        gate.check(f"delete EndpointSlice {mm.namespace}/{name}")
        try:
            await self._objects.delete_namespaced_custom_object(group, version, mm.namespace, "endpointslices", name)
        except ApiException as e:
            if e.status == 404:
                return "unchanged"
            raise
        return "deleted"
