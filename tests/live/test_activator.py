"""The activator with real sockets in front of real model-server processes (``tests/realparts/modelserver.py``).

The activator runs in the test's loop (its routes fed the EndpointSlice JSON the watch would deliver); the model
servers are subprocesses; the controller is a tiny aiohttp server that records the activation reports.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from test_activator_routes import activator_slice, pod_slice

from autoscaler.live.activator.metrics import ActivatorMetrics
from autoscaler.live.activator.notify import Notifier
from autoscaler.live.activator.proxy import Activator, new_session
from autoscaler.live.activator.routes import RouteTable

MODELSERVER = Path(__file__).resolve().parents[1] / "realparts" / "modelserver.py"
MODEL = {"X-Slotwise-Model": "ns/llm"}
pytestmark = pytest.mark.asyncio
pytest_plugins = ("realparts.kube",)  # the SIGTERM test runs `slotwise activator` against the real apiserver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_modelserver(tmp: Path, token_ms: float) -> tuple[subprocess.Popen, int]:
    port = free_port()
    (tmp / f"replicas-{port}").write_text("1")
    proc = subprocess.Popen(
        [sys.executable, str(MODELSERVER), "--port", str(port), "--model", "llm", "--rps", "0", "--service-ms",
         "10", "--replicas-file", str(tmp / f"replicas-{port}"), "--token-ms", str(token_ms)],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("listening on"), "model server did not start"
    return proc, port


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    tmp = tmp_path_factory.mktemp("modelservers")
    procs = [start_modelserver(tmp, token_ms=100.0), start_modelserver(tmp, token_ms=100.0)]
    yield [p for _, p in procs]
    for proc, _ in procs:
        proc.terminate()
        proc.wait(10)


class Controller:
    """A stand-in controller endpoint: records every POST /v1/activations with its arrival time."""

    def __init__(self, status: int = 202) -> None:
        self.reports: list[tuple[float, dict[str, Any]]] = []
        self.status = status

    async def post(self, request: web.Request) -> web.Response:
        self.reports.append((time.monotonic(), await request.json()))
        if self.status >= 400:
            return web.Response(status=self.status, text="activation report refused: 10.0.0.9 is not an activator pod")
        return web.json_response({"leader": True}, status=self.status)


class Rig:
    def __init__(self, activator: Activator, url: str, controller: Controller, notifier: Notifier) -> None:
        self.activator, self.url, self.controller, self.notifier = activator, url, controller, notifier
        self.table = activator.table

    def front(self, backends: list[int]) -> None:
        self.table.apply("ADDED", activator_slice("ns", "llm", "llm-deploy"))
        self.set_backends(backends)

    def set_backends(self, ports: list[int], ready: bool = True) -> None:
        for i, port in enumerate(ports):
            r = self.table.apply("ADDED", pod_slice("ns", "llm", [("127.0.0.1", ready)], [("http", port)],
                                                    name=f"llm-{i}"))
            assert r is not None
            self.activator.on_change(r)


@pytest_asyncio.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    opts = getattr(request, "param", {})
    controller = Controller(opts.get("controller_status", 202))
    capp = web.Application()
    capp.router.add_post("/v1/activations", controller.post)
    crunner = web.AppRunner(capp, access_log=None)
    await crunner.setup()
    cport = free_port()
    await web.TCPSite(crunner, "127.0.0.1", cport).start()
    async with new_session() as session:
        activator = Activator(RouteTable(), ActivatorMetrics(), session, queue_limit=opts.get("limit", 100),
                              hold_timeout_s=opts.get("timeout", 30.0))
        notifier = Notifier(session, "activator-0", activator.report, controllers=[f"http://127.0.0.1:{cport}"],
                            interval_s=opts.get("interval", 1.0), refused=activator.metrics.reports_refused.inc)
        activator.kick = notifier.kick
        runner = web.ServerRunner(activator.proxy_server())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        task = asyncio.create_task(notifier.run())
        try:
            yield Rig(activator, f"http://127.0.0.1:{port}", controller, notifier)
        finally:
            task.cancel()
            await runner.cleanup()
            await crunner.cleanup()


async def eventually(cond: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def held(rig: Rig) -> int:
    q = rig.activator.queues.get("ns/llm")
    return len(q) if q else 0


async def test_plain_pass_through_by_header_and_host(rig: Rig, servers: list[int]) -> None:
    rig.front([servers[0]])
    async with aiohttp.ClientSession() as c:
        async with c.post(rig.url + "/v1/completions?x=1", json={"prompt": "hi", "max_tokens": 2}, headers=MODEL) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
            assert (await r.json())["choices"][0]["text"] == "tok0 tok1"
        async with c.post(rig.url + "/v1/completions", json={"max_tokens": 1},
                          headers={"Host": "llm.ns.svc.cluster.local:8012"}) as r:
            assert r.status == 200
        async with c.post(rig.url + "/v1/completions", json={}, headers={"Host": "other.ns"}) as r:
            assert r.status == 404 and "other.ns" in await r.text()
    forwarded = rig.activator.metrics.forwarded.labels("ns", "llm-deploy")._value.get()
    assert forwarded == 2


async def test_streamed_events_arrive_before_the_server_finishes(rig: Rig, servers: list[int]) -> None:
    """Tokens every 100 ms: the first event must reach the client long before the 10th is made."""
    rig.front([servers[0]])
    async with aiohttp.ClientSession() as c:
        t0 = time.monotonic()
        async with c.post(rig.url + "/v1/completions", json={"max_tokens": 10, "stream": True},
                          headers=MODEL) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
            first = await r.content.readline()
            t_first = time.monotonic() - t0
            rest = (await r.read()).decode()
        t_all = time.monotonic() - t0
    assert first.startswith(b"data: {") and json.loads(first[6:])["token"] == 0
    assert rest.rstrip().endswith("data: [DONE]") and rest.count("data: {") == 9
    assert t_first < 0.6 and t_all >= 1.0, (t_first, t_all)


async def test_held_requests_released_oldest_first_when_ready_and_controller_told_at_once(
        rig: Rig, servers: list[int]) -> None:
    rig.front([])
    order: list[int] = []
    async with aiohttp.ClientSession() as c:
        async def one(i: int) -> int:
            async with c.post(rig.url + "/v1/completions", json={"max_tokens": 0}, headers=MODEL) as r:
                await r.read()
                order.append(i)
                return r.status

        t0 = time.monotonic()
        first = asyncio.create_task(one(0))
        await eventually(lambda: rig.controller.reports, "no activation report")
        t_report = rig.controller.reports[0][0] - t0
        report = rig.controller.reports[0][1]
        assert report["activator"] == "activator-0"
        assert report["models"] == [{"namespace": "ns", "service": "llm", "model": "llm-deploy", "held": 1,
                                     "oldest_wait_s": report["models"][0]["oldest_wait_s"]}]
        assert t_report < 0.5, f"first report {t_report:.2f} s after the first held request: not at once"
        tasks = [first] + [asyncio.create_task(one(i)) for i in range(1, 5)]
        await eventually(lambda: held(rig) == 5, "not all held")
        assert rig.activator.metrics.held.labels("ns", "llm-deploy")._value.get() == 5
        await asyncio.sleep(1.2)  # reports keep coming every second while requests are held
        assert any(m["held"] == 5 for _, rep in rig.controller.reports for m in rep["models"])
        rig.set_backends([servers[1]])
        assert await asyncio.gather(*tasks) == [200] * 5
    assert held(rig) == 0


async def test_release_forwards_in_arrival_order(rig: Rig, servers: list[int]) -> None:
    """Released requests reach the backend oldest first: their streams start in arrival order."""
    rig.front([])
    async with aiohttp.ClientSession() as c:
        async def one() -> float:
            async with c.post(rig.url + "/v1/completions", json={"max_tokens": 1, "stream": True},
                              headers=MODEL) as r:
                line = await r.content.readline()
                return json.loads(line[6:])["t"]

        tasks = []
        for n in range(1, 5):
            tasks.append(asyncio.create_task(one()))
            await eventually(lambda n=n: held(rig) == n, "not held")
        rig.set_backends([servers[0]])
        stamps = await asyncio.gather(*tasks)
    assert stamps == sorted(stamps)


@pytest.mark.parametrize("rig", [{"limit": 2}], indirect=True)
async def test_queue_full_503_with_retry_after(rig: Rig, servers: list[int]) -> None:
    rig.front([])
    async with aiohttp.ClientSession() as c:
        waiting = [asyncio.create_task(c.post(rig.url + "/", headers=MODEL)) for _ in range(2)]
        await eventually(lambda: held(rig) == 2, "not held")
        async with c.post(rig.url + "/", headers=MODEL) as r:
            assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
        assert rig.activator.metrics.queue_full._value.get() == 1
        for w in waiting:
            w.cancel()


@pytest.mark.parametrize("rig", [{"timeout": 0.5}], indirect=True)
async def test_hold_timeout_504(rig: Rig, servers: list[int]) -> None:
    rig.front([])
    async with aiohttp.ClientSession() as c:
        t0 = time.monotonic()
        async with c.post(rig.url + "/v1/completions", headers=MODEL) as r:
            assert r.status == 504
        assert 0.4 < time.monotonic() - t0 < 3
    assert held(rig) == 0 and rig.activator.metrics.timeouts._value.get() == 1


async def test_disconnecting_client_leaves_no_queue_entry(rig: Rig, servers: list[int]) -> None:
    rig.front([])
    async with aiohttp.ClientSession() as c:
        gone = asyncio.create_task(c.post(rig.url + "/", headers=MODEL))
        await eventually(lambda: held(rig) == 1, "not held")
        gone.cancel()  # the client closes its connection
    await eventually(lambda: held(rig) == 0, "the abandoned request is still queued")
    assert rig.activator.metrics.held.labels("ns", "llm-deploy")._value.get() == 0


async def test_refused_backend_retried_on_another_else_502(rig: Rig, servers: list[int]) -> None:
    dead = free_port()
    rig.front([dead, servers[0]])
    async with aiohttp.ClientSession() as c:
        for _ in range(4):  # round robin hits the dead one every other time; each is retried on the live one
            async with c.post(rig.url + "/v1/completions", json={"max_tokens": 1}, headers=MODEL) as r:
                assert r.status == 200
        rig.table.apply("DELETED", pod_slice("ns", "llm", [], [("http", servers[0])], name="llm-1"))
        async with c.post(rig.url + "/v1/completions", json={"max_tokens": 1}, headers=MODEL) as r:
            assert r.status == 502


@pytest.mark.parametrize("rig", [{"interval": 5.0}], indirect=True)
async def test_first_held_request_reported_at_once_not_at_the_next_period(rig: Rig, servers: list[int]) -> None:
    """With a 5 s report period, the report of the first held request must still come within half a second."""
    await asyncio.sleep(0.1)  # the notifier is now waiting out its period
    rig.front([])
    async with aiohttp.ClientSession() as c:
        t0 = time.monotonic()
        waiting = asyncio.create_task(c.post(rig.url + "/", headers=MODEL))
        await eventually(lambda: rig.controller.reports, "no activation report", timeout=8)
        assert rig.controller.reports[0][0] - t0 < 0.5
        assert rig.controller.reports[0][1]["models"][0]["held"] == 1
        waiting.cancel()


@pytest.mark.parametrize("rig", [{"timeout": 1.0}], indirect=True)
async def test_flapping_backends_do_not_restart_the_hold_timeout(rig: Rig, servers: list[int]) -> None:
    """A backend that turns ready and unready again every 0.4 s releases the held request each time, finds no
    backend and holds it again: the 504 must still come at the hold timeout counted from the first admit."""
    rig.front([])

    async def flap() -> None:
        for _ in range(6):
            await asyncio.sleep(0.4)
            rig.set_backends([servers[0]], ready=True)  # released ...
            rig.set_backends([servers[0]], ready=False)  # ... and gone before the handler runs again

    flapping = asyncio.create_task(flap())
    async with aiohttp.ClientSession() as c:
        t0 = time.monotonic()
        async with c.post(rig.url + "/v1/completions", headers=MODEL) as r:
            status, waited = r.status, time.monotonic() - t0
    flapping.cancel()
    assert status == 504 and 0.9 < waited < 1.5, (status, waited)
    assert held(rig) == 0


async def test_held_requests_answered_503_when_their_route_disappears(rig: Rig, servers: list[int]) -> None:
    """The Service is deleted (its slices go): requests held for it get 503 + Retry-After at once, not the 504
    after the hold timeout (30 s here); the same after a re-list that no longer has it."""
    async with aiohttp.ClientSession() as c:
        for gone in ("deleted", "relisted"):
            rig.front([])
            waiting = [asyncio.create_task(c.post(rig.url + "/v1/completions", headers=MODEL)) for _ in range(2)]
            await eventually(lambda: held(rig) == 2, "not held")
            t0 = time.monotonic()
            if gone == "deleted":
                r = rig.table.apply("DELETED", activator_slice("ns", "llm", "llm-deploy"))
                assert r is not None
                rig.activator.on_change(r)
            else:
                for r in rig.table.replace([]):
                    rig.activator.on_change(r)
            for resp in await asyncio.gather(*waiting):
                assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1, gone
                resp.release()
            assert time.monotonic() - t0 < 1.0, gone
            assert held(rig) == 0 and "ns/llm" not in rig.activator.queues
            assert rig.activator.metrics.held.labels("ns", "llm-deploy")._value.get() == 0
    # the controller hears the model's held count drop to 0
    await eventually(lambda: any(m["held"] == 0 and m["model"] == "llm-deploy"
                                 for _, rep in rig.controller.reports for m in rep["models"]), "no held 0 report")


async def _post_slice(api: Any, ns: str, body: dict[str, Any]) -> None:
    from autoscaler.live.activator.watch import slice_version
    from autoscaler.live.kube.discovery import discover

    version = slice_version(await discover(api))
    body = {**body, "apiVersion": f"discovery.k8s.io/{version}"}
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
    resp = await api.call_api(f"/apis/discovery.k8s.io/{version}/namespaces/{ns}/endpointslices", "POST",
                              body=body, header_params={"Content-Type": "application/json"},
                              auth_settings=["BearerToken"], _preload_content=False)
    assert resp.status < 300, await resp.text()


async def test_sigterm_drains_a_held_request_then_exits_0(api: Any, kube_apiserver: Any, servers: list[int],
                                                          tmp_path: Path) -> None:
    """The process gets SIGTERM while it holds a request: /readyz fails at once, new connections are refused, and
    when a backend then appears the held request is still answered 200; then the process exits 0."""
    from kubernetes_asyncio import client

    ns = "drain-" + uuid.uuid4().hex[:6]
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    await _post_slice(api, ns, activator_slice(ns, "llm", "llm-deploy"))
    port, admin = free_port(), free_port()
    log = tmp_path / "activator.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler.cli.main", "activator", "--kubeconfig", str(kube_apiserver.kubeconfig),
         "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin), "--namespace", ns,
         "--pod-name", "activator-drain", "--hold-timeout-s", "60", "--drain-timeout-s", "30", "--port-count", "1"],
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession() as c:
            async def status(url: str) -> int:
                try:
                    async with c.get(url) as r:
                        return r.status
                except aiohttp.ClientError:
                    return 0

            deadline = time.monotonic() + 30
            while await status(f"http://127.0.0.1:{admin}/readyz") != 200:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # the watch has the route (the informers synced with it listed)
            request = asyncio.create_task(c.post(f"http://127.0.0.1:{port}/v1/completions",
                                                 json={"max_tokens": 2}, headers={"X-Slotwise-Model": f"{ns}/llm"}))

            async def held() -> bool:
                async with c.get(f"http://127.0.0.1:{admin}/metrics") as r:
                    text = await r.text()
                return f'slotwise_activator_held_requests{{model="llm-deploy",namespace="{ns}"}} 1.0' in text

            deadline = time.monotonic() + 10
            while not await held():
                assert not request.done() and time.monotonic() < deadline, log.read_text()[-2000:]
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while await status(f"http://127.0.0.1:{admin}/readyz") != 503:
                assert time.monotonic() < deadline, "/readyz still ready after SIGTERM"
                await asyncio.sleep(0.05)
            def refused() -> bool:  # the listener is closed: no new connections
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    return True
                return False

            await eventually(refused, "the proxy port still accepts connections after SIGTERM", timeout=3)
            assert not request.done() and proc.poll() is None  # still holding
            await _post_slice(api, ns, pod_slice(ns, "llm", [("127.0.0.1", True)], [("http", servers[0])]))
            resp = await asyncio.wait_for(request, 15)
            assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "tok0 tok1"
        assert proc.wait(15) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("rig", [{"controller_status": 403, "interval": 0.1}], indirect=True)
async def test_a_refused_report_is_counted_and_warned_once(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """A controller that refuses the reports (403: the activator's address is not one it knows) must not be silent:
    a model at zero is woken by nothing else. Counted in the metric every time, warned once a minute."""
    rig.front([])
    async with aiohttp.ClientSession() as c:
        request = asyncio.create_task(c.post(rig.url + "/v1/completions", json={}, headers=MODEL))
        with caplog.at_level("WARNING", logger="slotwise.activator.notify"):
            await eventually(lambda: rig.notifier.refused >= 3, "the refusals are not counted")
        assert rig.activator.metrics.reports_refused._value.get() == rig.notifier.refused
        warnings = [r for r in caplog.records if "activation report refused" in r.getMessage()]
        assert len(warnings) == 1 and "403" in warnings[0].getMessage()
        request.cancel()
