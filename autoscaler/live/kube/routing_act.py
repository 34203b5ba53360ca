"""The calls behind ``SetRouting`` (issue 18): the controller's activator EndpointSlice of a model's Service.

``via_activator`` True creates or updates ``<service>-slotwise-activator`` (and ``...-ipv6`` for a Service with
the IPv6 family: one slice per family of ``spec.ipFamilies``; bodies from
:func:`~autoscaler.live.kube.routing.activator_slice`: the Ready activator pods' addresses of that family as
endpoints, every TCP Service port at 8012 + i); False deletes them. A planned route with no Ready activator pod
(for any family the Service has) is a failed write (:class:`NoActivator`): a slice without endpoints would send
that family's traffic nowhere once the model is at zero.

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
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.live.kube.objects import ManagedModel
from autoscaler.live.kube.routing import (
    FAMILIES,
    activator_endpoints,
    activator_slice,
    find_slice,
    service_families,
    slice_current,
    slice_name,
    slice_ports,
)
from autoscaler.live.kube.term import WriteGate

Retrying = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]

PORTS_TTL_S = 300.0  # a Service's port read this long ago is read again (a renamed port reaches the slice)


@dataclass(frozen=True)
class ServiceShape:
    """What the activator slices take from the model's Service: their ports and the IP families (one slice each)."""

    ports: list[dict[str, Any]]
    families: tuple[str, ...]


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
        self._ports: dict[tuple[str, str], tuple[float, ServiceShape]] = {}  # (ns, svc) -> (read at, its shape)
        self.reads = 0  # Service and slice GETs made (a reconcile in step makes none)

    @property
    def _gv(self) -> tuple[str, str]:
        group, _, version = self.api_version.partition("/")
        return group, version

    async def ports(self, mm: ManagedModel, *, fresh: bool = False) -> ServiceShape:
        """The slices' ports and families from the model's Service, cached ``PORTS_TTL_S`` (``fresh``: read it
        now)."""
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
        body = self._core.api_client.sanitize_for_serialization(svc)
        shape = ServiceShape(slice_ports(body), service_families(body))
        self._ports[key] = (self.clock(), shape)
        return shape

    def _want(self, mm: ManagedModel, shape: ServiceShape, *, allow_empty: bool) -> list[dict[str, Any]]:
        """One slice per family of the Service. A family without a Ready activator address is a failed route
        (``allow_empty``: a reconcile empties it instead)."""
        endpoints = activator_endpoints(self.activator_pods())
        want = [activator_slice(mm.namespace, mm.service or "", mm.name, shape.ports, endpoints, self.api_version,
                                family=f) for f in shape.families]
        empty = [s["addressType"] for s in want if not s["endpoints"]]
        if empty and not allow_empty:
            which = "" if not endpoints else f" with an {'/'.join(empty)} address"
            raise NoActivator(f"{mm.key}: no Ready activator pod{which} to route Service {mm.namespace}/{mm.service} "
                              "to (is the activator running?); not routed, so not scaled to zero")
        return want

    async def desired(self, mm: ManagedModel, *, allow_empty: bool = False,
                      fresh: bool = True) -> list[dict[str, Any]]:
        return self._want(mm, await self.ports(mm, fresh=fresh), allow_empty=allow_empty)

    def in_step(self, mm: ManagedModel) -> bool | None:
        """Whether the model's slice as the informer holds it already says what it should (True: nothing to do),
        from memory only. None: not answerable without a read (no informer, or the Service's ports not cached)."""
        if self.slices is None or mm.service is None:
            return None
        cached = self._ports.get((mm.namespace, mm.service))
        if cached is None or self.clock() - cached[0] >= PORTS_TTL_S:
            return None
        slices = list(self.slices())
        for want in self._want(mm, cached[1], allow_empty=True):
            have = find_slice(slices, mm.namespace, mm.service, want["addressType"])
            if have is None or not slice_current(have, want):
                return False
        # a family the Service no longer has (made single-stack) leaves a slice to delete
        return all(find_slice(slices, mm.namespace, mm.service, f) is None
                   for f in FAMILIES if f not in cached[1].families)

    async def route(self, mm: ManagedModel, gate: WriteGate, retrying: Retrying, *, reconcile: bool = False) -> str:
        """Traffic through the activator: create or update the slice of every family of the Service (and delete
        one of a family it no longer has). Answers what was done ("created", "updated", "unchanged"; the most
        of the slices). Raises on failure (the caller then must not scale the model to zero), also
        :class:`NoActivator` when no activator pod is Ready (for some family) -- except for a ``reconcile`` of
        slices already there, which then are emptied (their pods are gone: their IPs must not keep the Service's
        traffic)."""

        async def attempt() -> str:
            shape = await self.ports(mm, fresh=not reconcile)
            done = [await self._write(mm, want, gate) for want in self._want(mm, shape, allow_empty=reconcile)]
            for family in FAMILIES:
                if family not in shape.families and self._may_have(mm, family) \
                        and await self._delete(mm, family, gate) == "deleted":
                    done.append("updated")
            return next((d for d in ("created", "updated") if d in done), "unchanged")

        return await retrying(attempt)

    def _may_have(self, mm: ManagedModel, family: str) -> bool:
        """Whether a slice of ``family`` may exist (the informer's copy says so, or there is no informer): a
        single-stack Service's route then costs no DELETE of an IPv6 slice that never was."""
        return self.slices is None or find_slice(self.slices(), mm.namespace, mm.service or "", family) is not None

    async def _write(self, mm: ManagedModel, want: dict[str, Any], gate: WriteGate) -> str:
        group, version = self._gv
        name = want["metadata"]["name"]
        self.reads += 1
        try:
            have = await self._objects.get_namespaced_custom_object(group, version, mm.namespace, "endpointslices",
                                                                    name)
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
            await self._objects.create_namespaced_custom_object(group, version, mm.namespace, "endpointslices", want)
            return "created"
        want["metadata"]["resourceVersion"] = (have.get("metadata") or {}).get("resourceVersion")
        await self._objects.replace_namespaced_custom_object(group, version, mm.namespace, "endpointslices",
                                                             name, want)
        return "updated"

    async def _delete(self, mm: ManagedModel, family: str, gate: WriteGate) -> str:
        group, version = self._gv
        name = slice_name(mm.service or "", family)
        gate.check(f"delete EndpointSlice {mm.namespace}/{name}")
        try:
            await self._objects.delete_namespaced_custom_object(group, version, mm.namespace, "endpointslices", name)
        except ApiException as e:
            if e.status == 404:
                return "unchanged"
            raise
        return "deleted"

    async def unroute(self, mm: ManagedModel, gate: WriteGate) -> str:
        """Traffic straight to the pods: delete the slices of every family ("deleted", or "unchanged" when there
        was none)."""
        done = [await self._delete(mm, family, gate) for family in FAMILIES]
        return "deleted" if "deleted" in done else "unchanged"
