"""The activator's routes from EndpointSlice JSON (pure): fronted Services, ready backends, Host parsing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.live.activator.holding import HoldQueue
from autoscaler.live.activator.routes import RouteTable


def activator_slice(ns: str, svc: str, model: str, port_name: str = "http") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{svc}-slotwise-activator", "namespace": ns, "resourceVersion": "1",
                         "labels": {"kubernetes.io/service-name": svc,
                                    "endpointslice.kubernetes.io/managed-by": "slotwise.io",
                                    "slotwise.io/model": model}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.9.0.1"], "conditions": {"ready": True}}],
            "ports": [{"name": port_name, "protocol": "TCP", "port": 8012}]}


def pod_slice(ns: str, svc: str, endpoints: list[tuple[str, bool | None]], ports: list[tuple[str, int]],
              name: str = "") -> dict[str, Any]:
    eps = []
    for ip, ready in endpoints:
        cond = {} if ready is None else {"ready": ready}
        eps.append({"addresses": [ip], "conditions": cond})
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name or f"{svc}-abcde", "namespace": ns, "resourceVersion": "2",
                         "labels": {"kubernetes.io/service-name": svc,
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4", "endpoints": eps,
            "ports": [{"name": n, "protocol": "TCP", "port": p} for n, p in ports]}


def test_only_services_with_the_activator_slice_are_routes() -> None:
    t = RouteTable()
    assert t.apply("ADDED", pod_slice("a", "llm", [("10.0.0.1", True)], [("http", 8000)])) is None
    assert t.lookup("a/llm", None) is None
    r = t.apply("ADDED", activator_slice("a", "llm", "llm-deploy"))
    assert r is not None and r.model == "llm-deploy"
    # the pods' slice seen before the activator's still counts
    assert r.backends == ("http://10.0.0.1:8000",)


def test_ready_endpoints_at_the_port_named_like_the_activator_slice() -> None:
    t = RouteTable()
    t.apply("ADDED", activator_slice("a", "llm", "m", port_name="http"))
    r = t.apply("ADDED", pod_slice("a", "llm", [("10.0.0.2", True), ("10.0.0.3", False), ("10.0.0.4", None)],
                                   [("metrics", 9000), ("http", 8000)]))
    assert r is not None
    assert r.backends == ("http://10.0.0.2:8000", "http://10.0.0.4:8000")  # unset ready reads as ready
    r = t.apply("MODIFIED", pod_slice("a", "llm", [("10.0.0.2", False)], [("http", 8000)]))
    assert r is not None and r.backends == ()


def test_one_port_slice_needs_no_name_match_and_ipv6_is_bracketed() -> None:
    t = RouteTable()
    t.apply("ADDED", activator_slice("a", "llm", "m", port_name=""))
    s = pod_slice("a", "llm", [("fd00::5", True)], [("web", 8080)])
    s["addressType"] = "IPv6"
    r = t.apply("ADDED", s)
    assert r is not None and r.backends == ("http://[fd00::5]:8080",)


@pytest.mark.parametrize("host", ["llm.a", "llm.a.svc", "llm.a.svc.cluster.local", "LLM.A.svc:80",
                                  "llm.a.svc.cluster.local:8012", "llm", "llm:8012"])
def test_host_forms(host: str) -> None:
    t = RouteTable()
    t.apply("ADDED", activator_slice("a", "llm", "m"))
    r = t.lookup(None, host)
    assert r is not None and r.key == "a/llm"


def test_header_wins_over_host_and_unknown_names_what_was_looked_for() -> None:
    t = RouteTable()
    t.apply("ADDED", activator_slice("a", "llm", "m"))
    t.apply("ADDED", activator_slice("b", "chat", "c"))
    r = t.lookup("b/chat", "llm.a")
    assert r is not None and r.key == "b/chat"
    assert t.lookup("b/llm", "llm.a") is None  # a header that names nothing is not second-guessed by Host
    assert "b/llm" in t.why_not("b/llm", None)
    assert "nothing.a" in t.why_not(None, "nothing.a")


def test_bare_name_only_when_unique() -> None:
    t = RouteTable()
    t.apply("ADDED", activator_slice("a", "llm", "m1"))
    t.apply("ADDED", activator_slice("b", "llm", "m2"))
    assert t.lookup(None, "llm") is None
    assert "ambiguous" in t.why_not(None, "llm:8012") and "a/llm" in t.why_not(None, "llm")
    assert t.lookup(None, "llm.b").model == "m2"  # type: ignore[union-attr]
    t.apply("DELETED", activator_slice("b", "llm", "m2"))
    assert t.lookup(None, "llm").key == "a/llm"  # type: ignore[union-attr]


def test_route_stays_while_the_service_has_slices_and_goes_with_the_last() -> None:
    """kube-proxy still sends traffic here for a moment after the controller deleted its slice."""
    t = RouteTable()
    t.apply("ADDED", activator_slice("a", "llm", "m"))
    t.apply("ADDED", pod_slice("a", "llm", [("10.0.0.1", True)], [("http", 8000)]))
    r = t.apply("DELETED", activator_slice("a", "llm", "m"))
    assert r is not None and t.lookup("a/llm", None) is r and r.backends
    r = t.apply("DELETED", pod_slice("a", "llm", [], [("http", 8000)]))
    assert r is not None and r.backends == () and t.lookup("a/llm", None) is None
    assert t.lookup(None, "llm") is None


def test_replace_keeps_route_identity() -> None:
    t = RouteTable()
    first = t.apply("ADDED", activator_slice("a", "llm", "m"))
    t.apply("ADDED", activator_slice("b", "gone", "g"))
    routes = t.replace([activator_slice("a", "llm", "m"),
                        pod_slice("a", "llm", [("10.0.0.7", True)], [("http", 8000)])])
    assert t.lookup("a/llm", None) is first and first is not None and first.backends == ("http://10.0.0.7:8000",)
    assert t.lookup("b/gone", None) is None and {r.key for r in routes} == {"a/llm", "b/gone"}


def test_hold_queue_fifo_bound_discard_and_retry_after() -> None:
    q = HoldQueue(limit=2)
    assert q.admit("r1", 10.0) and q.admit("r2", 11.0) and not q.admit("r3", 11.5)
    assert q.retry_after_s(13.0) == 3  # no wake-up seen yet: as long as this one has lasted
    assert q.discard("r1") == 10.0 and q.discard("r1") is None and len(q) == 1
    assert q.oldest_wait_s(13.0) == 2.0
    assert [e for e, _ in q.drain(30.0)] == ["r2"] and len(q) == 0 and q.last_wake_s == 20.0
    q.admit("r4", 40.0)
    assert q.retry_after_s(45.0) == 15  # the last wake-up took 20 s, this one is 5 s in
    assert q.retry_after_s(100.0) == 1  # overdue: the floor


def test_a_hold_stretch_that_ends_without_a_wake_up_does_not_leak_its_start_into_the_next() -> None:
    """Held at t=0, abandoned; held again at t=3600: that is a fresh wait (Retry-After from its own age, and the
    wake-up it ends with lasted 10 s, not 3610 s)."""
    q = HoldQueue(limit=10)
    assert q.admit("r1", 0.0)
    q.discard("r1")  # the client went away (or timed out): the queue is empty
    assert q.admit("r2", 3600.0)
    assert q.retry_after_s(3601.0) == 1
    q.drain(3610.0)
    assert q.last_wake_s == 10.0


@given(st.lists(st.tuples(st.sampled_from(["admit", "discard", "drain"]), st.integers(0, 5),
                          st.floats(0, 100, allow_nan=False)), max_size=40))
def test_wake_started_is_the_first_arrival_of_the_current_stretch(ops: list[tuple[str, int, float]]) -> None:
    """Whatever the mix of admits, discards and drains: a stretch starts at the arrival that found the queue empty
    and ends whenever it empties; a drain's wake-up is measured from that arrival."""
    q = HoldQueue(limit=4)
    now, start = 0.0, None
    for op, entry, dt in ops:
        now += dt
        if op == "admit":
            was_empty = not len(q)
            if q.admit(entry, now) and was_empty:
                start = now
        elif op == "discard":
            q.discard(entry)
        else:
            nonempty = bool(len(q))
            q.drain(now)
            if nonempty:
                assert start is not None and q.last_wake_s == now - start
        if not len(q):
            start = None
        assert q.wake_started == start


def test_every_fronted_port_has_its_own_activator_port_and_backends() -> None:
    """Issue 30: the controller's slice maps Service port i to activator port 8012 + i; a request is forwarded
    to the backends of the Service port mapped to the activator port it arrived on."""
    t = RouteTable()
    two = activator_slice("a", "llm", "m")
    two["ports"] = [{"name": "http", "protocol": "TCP", "port": 8012},
                    {"name": "grpc", "protocol": "TCP", "port": 8013}]
    t.apply("ADDED", two)
    r = t.apply("ADDED", pod_slice("a", "llm", [("10.0.0.2", True)], [("grpc", 9000), ("http", 8000)]))
    assert r is not None and r.ports == {8012: "http", 8013: "grpc"}
    assert r.backends_at(8012) == ("http://10.0.0.2:8000",) == r.backends
    assert r.backends_at(8013) == ("http://10.0.0.2:9000",)
    assert r.backends_at(8014) is None  # no Service port there: the proxy answers 404


def test_a_dual_stack_service_has_both_families_backends_and_one_port_map() -> None:
    t = RouteTable()
    v6 = activator_slice("a", "llm", "m")
    v6["metadata"] = {**v6["metadata"], "name": "llm-slotwise-activator-ipv6"}
    v6["addressType"], v6["endpoints"] = "IPv6", [{"addresses": ["fd00::9"], "conditions": {"ready": True}}]
    t.apply("ADDED", activator_slice("a", "llm", "m"))
    t.apply("ADDED", v6)
    t.apply("ADDED", pod_slice("a", "llm", [("10.0.0.2", True)], [("http", 8000)], name="llm-v4"))
    pods6 = pod_slice("a", "llm", [("fd00::2", True)], [("http", 8000)], name="llm-v6")
    pods6["addressType"] = "IPv6"
    r = t.apply("ADDED", pods6)
    assert r is not None and r.ports == {8012: "http"}
    assert r.backends_at(8012) == ("http://10.0.0.2:8000", "http://[fd00::2]:8000")
    # the IPv4 activator slice goes (a Service made IPv6-only): still fronted through the IPv6 one
    r = t.apply("DELETED", activator_slice("a", "llm", "m"))
    assert r is not None and t.lookup("a/llm", None) is r and r.ports == {8012: "http"}
