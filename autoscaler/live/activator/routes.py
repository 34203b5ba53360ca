"""Routes and backends from EndpointSlices: which fronted Service a request is for, and where it may go. Pure.

A Service is *fronted* once the controller's activator slice (``<service>-slotwise-activator``, managed by
``slotwise.io``, ``slotwise.io/model: <workload>``) has been seen for it; it stays routable while it has any
slice left, so requests kube-proxy still sends here just after the controller removed its slice pass through.
The Service's other slices list its pods: their ready endpoints (``conditions.ready`` true or unset, as the API
says to read "unknown") at the port matched by name are the backends -- of every address family (a dual-stack
Service has an IPv4 and an IPv6 slice; an IPv6 backend is ``http://[addr]:port``).

Every Service port is fronted: the activator slice maps each Service port (by name) to one activator port (8012 +
i, :attr:`Route.ports`), and a request is forwarded to the backends of the Service port that maps to the activator
port it arrived on (:meth:`Route.backends_at`).

Lookups are precomputed dicts (the hot path is one ``dict.get``): by ``ns/service`` and by every Host form
(``svc.ns``, ``svc.ns.svc``, ``svc.ns.svc.cluster.local``, and a bare ``svc`` when exactly one fronted Service
has that name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.live.kube.objects import (
    ACTIVATOR_PORT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    SERVICE_NAME_LABEL,
)

ACTIVATOR_SUFFIX = "-slotwise-activator"


@dataclass(eq=False)
class Route:
    """One fronted Service: its key ``ns/service``, the workload name, the backend base URLs (``http://ip:port``)
    of its first port (``backends``) and of every fronted port (``by_port``: Service port name -> URLs), and which
    activator port serves which Service port (``ports``: activator port -> Service port name)."""

    namespace: str
    service: str
    model: str
    backends: tuple[str, ...] = ()
    port_name: str = ""
    slices: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    rr: int = 0  # round-robin position
    extra: Any = None  # the proxy's per-route state (metric children)
    ports: dict[int, str] = field(default_factory=dict)
    by_port: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.service}"

    def backends_at(self, port: int) -> tuple[str, ...] | None:
        """The backends for a request that arrived on activator port ``port``; None: the Service has no port
        fronted there (a route without a port map -- its slice not seen yet -- serves its first port at 8012)."""
        if not self.ports:
            return self.backends if port == ACTIVATOR_PORT else None
        name = self.ports.get(port)
        return None if name is None else self.by_port.get(name, ())


def _labels(s: Mapping[str, Any]) -> Mapping[str, str]:
    return (s.get("metadata") or {}).get("labels") or {}


def is_activator_slice(s: Mapping[str, Any]) -> bool:
    return _labels(s).get(MANAGED_BY_LABEL) == MANAGED_BY


def _url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def port_map(ours: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Activator port -> Service port name, from the controller's activator slices (one per IP family, the same
    ports)."""
    out: dict[int, str] = {}
    for s in ours:
        for p in s.get("ports") or ():
            if p.get("port"):
                out.setdefault(int(p["port"]), str(p.get("name") or ""))
    return out


def backends(slices: Iterable[Mapping[str, Any]], port_name: str) -> tuple[str, ...]:
    """Ready endpoints of the pods' slices, at the port named ``port_name`` (a one-port slice: its port), sorted."""
    out: set[str] = set()
    for s in slices:
        if is_activator_slice(s) or s.get("addressType") == "FQDN":
            continue
        ports = [p for p in s.get("ports") or () if p.get("port")]
        port = next((p for p in ports if (p.get("name") or "") == port_name), None)
        if port is None and len(ports) == 1:
            port = ports[0]
        if port is None:
            continue
        for ep in s.get("endpoints") or ():
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for a in (ep.get("addresses") or ())[:1]:
                out.add(_url(a, int(port["port"])))
    return tuple(sorted(out))


def host_forms(namespace: str, service: str) -> tuple[str, ...]:
    base = f"{service}.{namespace}"
    return (base, base + ".svc", base + ".svc.cluster.local")


class RouteTable:
    """The fronted Services, updated one slice event at a time (:meth:`apply`, :meth:`replace`)."""

    def __init__(self) -> None:
        self.by_key: dict[str, Route] = {}
        self.by_host: dict[str, Route] = {}
        self._bare: dict[str, set[str]] = {}  # service name -> keys
        self._pending: dict[str, dict[str, Mapping[str, Any]]] = {}  # slices of Services not (yet) fronted

    # --- lookups (the hot path) -------------------------------------------------------------------------------

    def lookup(self, header: str | None, host: str | None) -> Route | None:
        if header:
            return self.by_key.get(header.strip())
        if not host:
            return None
        h = host.lower()
        if h.endswith("]") or h.count(":") != 1:
            return self.by_host.get(h)
        return self.by_host.get(h.rsplit(":", 1)[0])

    def why_not(self, header: str | None, host: str | None) -> str:
        """The 404 text: what was looked for, and why nothing matched."""
        if header:
            return f"no model fronted by this activator for X-Slotwise-Model {header!r} (expected namespace/service)"
        name = (host or "").lower().rsplit(":", 1)[0]
        if name in self._bare and len(self._bare[name]) > 1:
            return (f"Host {host!r} is ambiguous: Services named {name!r} in several namespaces "
                    f"({', '.join(sorted(self._bare[name]))}); use svc.namespace or X-Slotwise-Model")
        return f"no model fronted by this activator for Host {host!r} (and no X-Slotwise-Model header)"

    # --- updates --------------------------------------------------------------------------------------------

    def apply(self, event: str, s: Mapping[str, Any]) -> Route | None:
        """One ADDED/MODIFIED/DELETED slice; returns the Route it changed (None: no fronted Service changed)."""
        meta = s.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        service = _labels(s).get(SERVICE_NAME_LABEL)
        if not service:
            return None
        key = f"{ns}/{service}"
        route = self.by_key.get(key)
        slices = route.slices if route is not None else self._pending.setdefault(key, {})
        if event == "DELETED":
            slices.pop(name, None)
        else:
            slices[name] = s
        if route is None:
            ours = next((x for x in slices.values() if is_activator_slice(x)), None)
            if ours is None:
                if not slices:
                    self._pending.pop(key, None)
                return None
            route = Route(ns, service, _labels(ours).get(MODEL_LABEL) or service, slices=slices)
            self._pending.pop(key, None)
            self._add(route)
        elif not slices:
            self._remove(route)
            route.backends, route.by_port = (), {}
            return route
        ours = [x for x in slices.values() if is_activator_slice(x)]
        if ours:  # gone (deleted while the pods' slices remain): the last port map stays, requests pass through
            route.model = _labels(ours[0]).get(MODEL_LABEL) or route.model
            route.ports = port_map(ours)
            route.port_name = route.ports[min(route.ports)] if route.ports else ""
        route.by_port = {name: backends(slices.values(), name) for name in set(route.ports.values())}
        route.backends = route.by_port.get(route.port_name) or backends(slices.values(), route.port_name)
        return route

    def replace(self, slices: Iterable[Mapping[str, Any]]) -> list[Route]:
        """A whole list (after a re-list): rebuild, keeping Route objects (and their state) where they remain."""
        old = self.by_key
        self.by_key, self.by_host, self._bare, self._pending = {}, {}, {}, {}
        fresh: dict[str, Route] = {}
        for s in slices:
            r = self.apply("ADDED", s)
            if r is not None:
                fresh[r.key] = r
        for key, r in list(self.by_key.items()):
            prev = old.get(key)
            if prev is not None:  # keep the identity the proxy's held queues and metrics hang on
                prev.model, prev.backends, prev.port_name, prev.slices = r.model, r.backends, r.port_name, r.slices
                prev.ports, prev.by_port = r.ports, r.by_port
                self._remove(r)
                self._add(prev)
                fresh[key] = prev
        gone = [r for k, r in old.items() if k not in self.by_key]
        for r in gone:
            r.backends, r.by_port = (), {}
        return list(fresh.values()) + gone

    def _add(self, route: Route) -> None:
        self.by_key[route.key] = route
        for h in host_forms(route.namespace, route.service):
            self.by_host[h] = route
        keys = self._bare.setdefault(route.service, set())
        keys.add(route.key)
        self._rebare(route.service)

    def _remove(self, route: Route) -> None:
        self.by_key.pop(route.key, None)
        for h in host_forms(route.namespace, route.service):
            if self.by_host.get(h) is route:
                del self.by_host[h]
        keys = self._bare.get(route.service, set())
        keys.discard(route.key)
        self._rebare(route.service)

    def _rebare(self, service: str) -> None:
        keys = self._bare.get(service) or set()
        if len(keys) == 1:
            self.by_host[service] = self.by_key[next(iter(keys))]
        else:
            self.by_host.pop(service, None)
            if not keys:
                self._bare.pop(service, None)
