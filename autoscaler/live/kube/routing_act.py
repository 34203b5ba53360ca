"""The calls behind ``SetRouting`` (issue 18): the controller's activator EndpointSlice of a model's Service.

``via_activator`` True creates or updates ``<service>-slotwise-activator`` (its body from
:func:`~autoscaler.live.kube.routing.activator_slice`: the Ready activator pods as endpoints, one port per
Service port at 8012); False deletes it. :meth:`RoutingActuation.reconcile` keeps the endpoints of the slice of a
model already going through the activator in step with the activator's pods (every tick, a write only when they
changed). Every write passes the tick's write gate right before it is made. The ordering against scaling (routing
before a scale to zero, and no scale to zero after a failed routing write) is the actuator's
(:meth:`~autoscaler.live.kube.actuator.KubeActuator.apply`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from autoscaler.live.kube.objects import ManagedModel
from autoscaler.live.kube.routing import activator_endpoints, activator_slice, slice_current, slice_name, slice_ports
from autoscaler.live.kube.term import WriteGate

Retrying = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


class NoService(Exception):
    """The model's ``slotwise.io/service`` names no Service in its namespace: nothing to route."""


class RoutingActuation:
    """Writes and deletes the activator EndpointSlices. ``activator_pods()`` lists the activator's pods (the
    controller's informer of them); ``api_version`` is the discovered ``discovery.k8s.io`` version."""

    def __init__(self, api_client: Any, activator_pods: Callable[[], Iterable[Mapping[str, Any]]] = list,
                 api_version: str = "discovery.k8s.io/v1") -> None:
        self._core = CoreV1Api(api_client)
        self._objects = CustomObjectsApi(api_client)
        self.activator_pods = activator_pods
        self.api_version = api_version

    @property
    def _gv(self) -> tuple[str, str]:
        group, _, version = self.api_version.partition("/")
        return group, version

    async def desired(self, mm: ManagedModel) -> dict[str, Any]:
        assert mm.service is not None
        try:
            svc = await self._core.read_namespaced_service(mm.service, mm.namespace)
        except ApiException as e:
            if e.status == 404:
                why = f"{mm.key}: Service {mm.namespace}/{mm.service} (slotwise.io/service) not found"
                raise NoService(why) from None
            raise
        svc_obj = self._core.api_client.sanitize_for_serialization(svc)
        return activator_slice(mm.namespace, mm.service, mm.name, slice_ports(svc_obj),
                               activator_endpoints(self.activator_pods()), self.api_version)

    async def route(self, mm: ManagedModel, gate: WriteGate, retrying: Retrying) -> str:
        """Traffic through the activator: create or update the slice. Answers what was done ("created",
        "updated", "unchanged"). Raises on failure (the caller then must not scale the model to zero)."""
        group, version = self._gv
        name = slice_name(mm.service or "")

        async def attempt() -> str:
            want = await self.desired(mm)
            try:
                have = await self._objects.get_namespaced_custom_object(group, version, mm.namespace,
                                                                        "endpointslices", name)
            except ApiException as e:
                if e.status != 404:
                    raise
                have = None
            if have is not None and slice_current(have, want):
                return "unchanged"
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
