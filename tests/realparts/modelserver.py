"""A stand-in model server for tests: simulated serving in real time, vLLM's metrics on ``/metrics``.

Run as a process::

    python tests/realparts/modelserver.py --port P --model NAME [--rps R | --trace FILE --trace-step-s S]
        --service-ms MS [--service-cv CV] --concurrency C --replicas-file F [--seed N]

Requests arrive as a Poisson process at the driven rate (``--rps``, or ``--trace``: one requests/s value per
line, the next one every ``--trace-step-s`` seconds, the last one held), wait in one FIFO queue, and are
served by ``N * C`` concurrent slots, N being the replica count read from ``--replicas-file`` once a second
(missing or unreadable: 1), so a test plays the Deployment's scale. A request's service time is lognormal
with mean ``--service-ms`` and coefficient of variation ``--service-cv``; its time to first token is its
queueing time plus ``--prefill-fraction`` of its service time.

Exported, with ``model_name=NAME`` (``namespace`` comes from the scrape config's target labels, as a
Kubernetes ServiceMonitor adds it): ``vllm:request_success_total{finished_reason="stop"}`` (counter),
``vllm:e2e_request_latency_seconds`` and ``vllm:time_to_first_token_seconds`` (histograms with vLLM's own
bucket bounds), ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (gauges). The request counter
exists from the start (value 0), as vLLM's does.

It prints ``listening on PORT`` once the HTTP server is up. The simulation advances every ``--tick-ms``
(event times are exact; only when a queued request starts is rounded to the tick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import math
import random
import sys
import time
from collections import deque
from pathlib import Path

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class Load:
    """The driven rate at a time since start: a constant, or a trace of one value per ``step_s``."""

    def __init__(self, rps: float | None, trace: list[float] | None, step_s: float) -> None:
        self.rps, self.trace, self.step_s = rps, trace, step_s

    def at(self, elapsed: float) -> float:
        if self.trace:
            return self.trace[min(int(elapsed / self.step_s), len(self.trace) - 1)]
        return self.rps or 0.0


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        trace = None
        if args.trace:
            trace = [float(x) for x in Path(args.trace).read_text().split() if x.strip()]
        self.load = Load(args.rps, trace, args.trace_step_s)
        cv = max(args.service_cv, 0.0)
        self.sigma = math.sqrt(math.log1p(cv * cv))
        self.mu = math.log(args.service_ms / 1000.0) - self.sigma**2 / 2  # lognormal with the given mean
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=self.registry).labels(args.model, "stop")
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=self.registry).labels(args.model)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry).labels(args.model)
        self.running_g = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                               labels, registry=self.registry).labels(args.model)
        self.waiting_g = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                               labels, registry=self.registry).labels(args.model)
        self.replicas = 1
        self.queue: deque[float] = deque()  # arrival times
        self.running: list[tuple[float, float, float]] = []  # heap of (finish, arrival, start)

    def read_replicas(self) -> None:
        # unreadable (missing, mid-write): keep the last known count
        with contextlib.suppress(OSError, ValueError):
            self.replicas = max(0, int(Path(self.args.replicas_file).read_text().strip()))

    def service_s(self) -> float:
        return self.rng.lognormvariate(self.mu, self.sigma) if self.sigma > 0 else math.exp(self.mu)

    def _finish(self, finish: float, arrival: float) -> None:
        self.e2e.observe(finish - arrival)
        self.success.inc()

    def _start(self, arrival: float, start: float) -> None:
        service = self.service_s()
        self.ttft.observe(start - arrival + self.args.prefill_fraction * service)
        heapq.heappush(self.running, (start + service, arrival, start))

    async def simulate(self) -> None:
        t0 = last = time.monotonic()
        next_event, is_arrival = self._next(t0, t0)
        next_replicas = t0
        while True:
            now = time.monotonic()
            if now >= next_replicas:
                self.read_replicas()
                next_replicas = now + 1.0
            while next_event <= now:
                if is_arrival:
                    self.queue.append(next_event)
                next_event, is_arrival = self._next(next_event, t0)
            # Completions in time order, each freeing a slot the queue takes at that very moment.
            capacity = self.replicas * self.args.concurrency
            while self.running and self.running[0][0] <= now:
                finish, arrival, _start = heapq.heappop(self.running)
                self._finish(finish, arrival)
                if self.queue and len(self.running) < capacity and self.queue[0] <= finish:
                    self._start(self.queue.popleft(), finish)
            while self.queue and len(self.running) < capacity:
                arrival = self.queue.popleft()
                self._start(arrival, max(arrival, last))
            self.running_g.set(len(self.running))
            self.waiting_g.set(len(self.queue))
            last = now
            await asyncio.sleep(self.args.tick_ms / 1000.0)

    def _next(self, t: float, t0: float) -> tuple[float, bool]:
        """The next event after ``t``: an arrival (True), or a trace boundary to redraw at (False). The
        rate is piecewise constant and the process memoryless, so redrawing at each boundary is exact."""
        boundary = math.inf
        if self.load.trace:
            boundary = t0 + (math.floor((t - t0) / self.load.step_s + 1e-9) + 1) * self.load.step_s
        rate = self.load.at(t - t0)
        if rate <= 0:
            return min(boundary, t + 1.0), False
        at = t + self.rng.expovariate(rate)
        return (at, True) if at <= boundary else (boundary, False)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", required=True)
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rps", type=float)
    load.add_argument("--trace", help="file: one requests/s value per line")
    p.add_argument("--trace-step-s", type=float, default=1.0)
    p.add_argument("--service-ms", type=float, required=True)
    p.add_argument("--service-cv", type=float, default=0.25)
    p.add_argument("--prefill-fraction", type=float, default=0.1)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--replicas-file", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tick-ms", type=float, default=10.0)
    return p.parse_args(argv)


async def main(argv: list[str]) -> None:
    disable_created_metrics()  # vLLM's scrape has no *_created series either
    server = Server(parse(argv))
    app = web.Application()
    app.router.add_get("/metrics", server.metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, server.args.host, server.args.port).start()
    print(f"listening on {server.args.port}", flush=True)
    try:
        await server.simulate()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
