"""The activator's pass-through cost: added latency per request, direct and via the activator side by side.

    python bench/activator_latency.py [--rate 1000] [--seconds 25] [--chunks 8] [--activator-core 0]
                                      [--loops asyncio,uvloop]

Three processes: a stand-in model server (answers at once; ``/stream`` writes N server-sent-event chunks, one
write each), the activator (the product's :class:`~autoscaler.live.activator.proxy.Activator` with one route to
that server, pinned to one core with ``os.sched_setaffinity``), and this load generator (on the other cores).
Open loop: requests are sent at fixed times, ``--rate`` per second to EACH path, the two paths alternating
request by request, and latency is measured from the scheduled send time to the last byte, so a stall anywhere
counts. Printed per mode (plain, streamed): p50/p99 direct, p50/p99 via the activator, and the added latency
(the via quantile minus the direct one). ``--loops``: the activator's event loops to measure, one after the
other in the same run (a fresh activator process each; ``auto`` is what ``slotwise activator`` runs by default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

from aiohttp import web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the stand-in model server: raw asyncio (cheap, so the load generator's core is not the bottleneck) ---------

PLAIN = b'{"choices": [{"text": "ok"}]}'
PLAIN_RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(PLAIN), PLAIN))


class _Backend(asyncio.Protocol):
    """HTTP/1.1 keep-alive, GET only: ``/stream?n=N`` answers N+1 SSE chunks, each its own write; else JSON."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            target = head.split(b" ", 2)[1]
            if target.startswith(b"/stream"):
                n = int(target.rsplit(b"=", 1)[1]) if b"n=" in target else 8
                self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for i in range(n):
                    chunk = b'data: {"token": %d}\n\n' % i
                    self.t.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.t.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            else:
                self.t.write(PLAIN_RESPONSE)


async def serve_backend(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Backend, "127.0.0.1", port, backlog=2048)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


# --- the activator, as `slotwise activator` builds it, with one route instead of the watch -------------------

async def serve_activator(port: int, backend: int) -> None:
    from autoscaler.live.activator.metrics import ActivatorMetrics
    from autoscaler.live.activator.proxy import Activator, new_session
    from autoscaler.live.activator.routes import RouteTable

    table = RouteTable()
    labels = {"kubernetes.io/service-name": "llm"}
    table.apply("ADDED", {"metadata": {"name": "llm-slotwise-activator", "namespace": "bench", "labels": {
        **labels, "endpointslice.kubernetes.io/managed-by": "slotwise.io", "slotwise.io/model": "llm"}},
        "ports": [{"name": "http", "port": 8012}], "endpoints": []})
    table.apply("ADDED", {"metadata": {"name": "llm-1", "namespace": "bench", "labels": labels},
                          "ports": [{"name": "http", "port": backend}],
                          "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]})
    async with new_session() as session:
        activator = Activator(table, ActivatorMetrics(), session)
        runner = web.ServerRunner(activator.proxy_server())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
        print("ready", flush=True)
        await asyncio.Event().wait()


# --- the load generator ---------------------------------------------------------------------------------------

def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class _Pool:
    """Keep-alive HTTP/1.1 connections to one address (asyncio streams: far cheaper than a full client)."""

    def __init__(self, port: int, headers: bytes) -> None:
        self.port, self.headers = port, headers
        self.free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str) -> int:
        conn = self.free.pop() if self.free else await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = conn
        writer.write(b"GET %s HTTP/1.1\r\nHost: llm.bench\r\n%s\r\n" % (path.encode(), self.headers))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await reader.readline()).strip(), 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            i = lower.index(b"content-length:") + 15
            await reader.readexactly(int(lower[i:lower.index(b"\r\n", i)]))
        self.free.append(conn)
        return status


async def measure(direct: int, via: int, path: str, rate: float, seconds: float) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {"direct": [], "via": []}
    errors = 0
    pools = {"direct": _Pool(direct, b""), "via": _Pool(via, b"X-Slotwise-Model: bench/llm\r\n")}

    async def one(kind: str, at: float) -> None:
        nonlocal errors
        try:
            ok = await pools[kind].get(path) == 200
        except (OSError, asyncio.IncompleteReadError, ValueError):
            ok = False
        if ok:
            lat[kind].append(time.perf_counter() - at)
        else:
            errors += 1

    # warm the pools, then the open loop: 2 * rate sends per second, direct and via alternating
    await asyncio.gather(*(one(k, time.perf_counter()) for k in ("direct", "via") for _ in range(20)))
    lat = {"direct": [], "via": []}
    tasks = set()
    interval = 1.0 / (2 * rate)
    t0 = time.perf_counter()
    for i in range(int(2 * rate * seconds)):
        at = t0 + i * interval
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(one("direct" if i % 2 == 0 else "via", at))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    lat["errors"] = [float(errors)]
    return lat


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=1000.0, help="requests/s on each path")
    p.add_argument("--seconds", type=float, default=25.0, help="per mode")
    p.add_argument("--chunks", type=int, default=8, help="server-sent events per streamed response")
    p.add_argument("--activator-core", type=int, default=0)
    p.add_argument("--loops", default="asyncio,uvloop", help="the activator's event loops, comma-separated")
    p.add_argument("--loop", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--role", choices=("backend", "activator"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--backend-port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "backend":
        asyncio.run(serve_backend(args.port))
        return 0
    if args.role == "activator":
        from autoscaler.live.activator.loop import run

        os.sched_setaffinity(0, {args.activator_core})
        run(serve_activator(args.port, args.backend_port), args.loop)
        return 0
    others = (os.sched_getaffinity(0) - {args.activator_core}) or {args.activator_core}
    os.sched_setaffinity(0, others)  # the load generator and the backend stay off the activator's core
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    me = [sys.executable, os.path.abspath(__file__), "--activator-core", str(args.activator_core)]
    from autoscaler.live.activator.loop import loop_factory

    loops = []
    for name in (x for x in args.loops.split(",") if x):
        try:
            loop_factory(name)
        except ValueError as e:
            print(f"skipping loop {name}: {e}")
            continue
        loops.append(name)
    print(f"nproc {os.cpu_count()}, python {sys.version.split()[0]}, rate {args.rate:g}/s per path, "
          f"{args.seconds:g} s per mode, activator on core {args.activator_core}, load generator and "
          f"backend on {sorted(others)}")
    print(f"{'loop':<8} {'mode':<10} {'direct p50':>10} {'p99':>8} {'via p50':>8} {'p99':>8} {'added p50':>10} "
          f"{'added p99':>10} {'errors':>6} {'cpu/req':>8}  (ms; cpu/req: activator CPU us per request)")
    bport = free_port()
    backend = subprocess.Popen([*me, "--role", "backend", "--port", str(bport)], stdout=subprocess.PIPE, env=env)
    try:
        assert backend.stdout is not None and backend.stdout.readline().strip() == b"ready"
        for loop in loops:
            aport = free_port()
            proc = subprocess.Popen([*me, "--role", "activator", "--port", str(aport), "--backend-port",
                                     str(bport), "--loop", loop], stdout=subprocess.PIPE, env=env)
            try:
                assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready", loop
                for mode, path in (("plain", "/v1/completions"), ("streamed", f"/stream?n={args.chunks}")):
                    cpu0 = cpu_s(proc.pid)
                    lat = asyncio.run(measure(bport, aport, path, args.rate, args.seconds))
                    per_req = (cpu_s(proc.pid) - cpu0) / max(1, len(lat["via"])) * 1e6
                    d50, d99 = quantile(lat["direct"], 0.5) * 1e3, quantile(lat["direct"], 0.99) * 1e3
                    v50, v99 = quantile(lat["via"], 0.5) * 1e3, quantile(lat["via"], 0.99) * 1e3
                    print(f"{loop:<8} {mode:<10} {d50:>10.2f} {d99:>8.2f} {v50:>8.2f} {v99:>8.2f} "
                          f"{v50 - d50:>10.2f} {v99 - d99:>10.2f} {int(lat['errors'][0]):>6} {per_req:>8.0f}",
                          flush=True)
            finally:
                proc.terminate()
                proc.wait(10)
    finally:
        backend.terminate()
        backend.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
