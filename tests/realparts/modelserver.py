"""A stand-in model server for tests: simulated serving in real time, vLLM's (or SGLang's, or TGI's) metrics on
``/metrics``.

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
exists from the start (value 0), as vLLM's does. Also ``vllm:inter_token_latency_seconds`` (one observation per
request: its decode time over ``--output-tokens``) and ``vllm:kv_cache_usage_perc``: the KV cache each running
request holds, ``1 / --kv-requests`` of a replica's (default: ``--concurrency``, so a full batch fills it), as a
fraction averaged over the replicas.

``--engine sglang`` exports the same under SGLang's names (``sglang:num_requests_total``,
``sglang:e2e_request_latency_seconds``, ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``
with SGLang's default buckets, ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``; labels
``model_name`` and ``engine_type``); ``--engine tgi`` TGI's (``tgi_request_success`` without a ``_total`` suffix,
``tgi_request_duration`` and ``tgi_request_mean_time_per_token_duration`` with TGI's duration buckets,
``tgi_queue_size``, ``tgi_batch_current_size``; NO model label, as TGI has none, and no TTFT or KV series).

``POST /v1/completions`` is a real request endpoint (for the activator's tests): JSON ``{"prompt": ...,
"max_tokens": N, "stream": bool}``; one token every ``--token-ms``; ``stream``: ``text/event-stream`` with one
``data: {...}`` event per token (each written as it is made), then ``data: [DONE]``; else one JSON answer at the
end. Each is counted as a request in the metrics (success counter, e2e latency) beside the simulated ones.

It prints ``listening on PORT`` once the HTTP server is up. The simulation advances every ``--tick-ms``
(event times are exact; only when a queued request starts is rounded to the tick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
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
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
# SGLang's defaults (python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
                      1800, 2400)
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
# TGI's router: every metric named *duration gets 35 geometric buckets from 0.0001 * 1.5 (router/src/server.rs)
TGI_DURATION_BUCKETS = tuple(0.0001 * 1.5**k for k in range(1, 36))


class _BareCounter:
    """A counter exported under its own name, without the ``_total`` suffix prometheus_client adds (TGI's Rust
    exporter writes ``tgi_request_success 42``); typed untyped, which Prometheus stores the same."""

    def __init__(self, name: str, doc: str, registry: CollectorRegistry) -> None:
        self.name, self.doc, self.value = name, doc, 0.0
        registry.register(self)

    def inc(self) -> None:
        self.value += 1

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import Metric

        m = Metric(self.name, self.doc, "unknown")
        m.add_sample(self.name, {}, self.value)
        yield m


class _Nothing:
    """A series the engine does not export."""

    def observe(self, _v: float) -> None:
        pass

    def set(self, _v: float) -> None:
        pass


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
        {"vllm": self._vllm, "sglang": self._sglang, "tgi": self._tgi}[args.engine](args.model)
        self.replicas = 1
        self.queue: deque[float] = deque()  # arrival times
        self.running: list[tuple[float, float, float]] = []  # heap of (finish, arrival, start)

    def _vllm(self, model: str) -> None:
        labels, r = ["model_name"], self.registry
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=r).labels(model, "stop")
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=r).labels(model)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=r).labels(model)
        self.running_g = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                               labels, registry=r).labels(model)
        self.waiting_g = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                               labels, registry=r).labels(model)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, buckets=ITL_BUCKETS, registry=r).labels(model)
        self.kv_g = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          labels, registry=r).labels(model)

    def _sglang(self, model: str) -> None:
        labels, r, values = ["model_name", "engine_type"], self.registry, (model, "unified")
        self.success = Counter("sglang:num_requests", "Number of requests processed.", labels,
                               registry=r).labels(*values)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in "
                             "seconds", labels, buckets=SGLANG_E2E_BUCKETS, registry=r).labels(*values)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=SGLANG_TTFT_BUCKETS, registry=r).labels(*values)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, buckets=SGLANG_ITL_BUCKETS, registry=r).labels(*values)
        self.running_g = Gauge("sglang:num_running_reqs", "The number of running requests.", labels,
                               registry=r).labels(*values)
        self.waiting_g = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels,
                               registry=r).labels(*values)
        self.kv_g = Gauge("sglang:token_usage", "The token usage.", labels, registry=r).labels(*values)

    def _tgi(self, _model: str) -> None:
        r = self.registry
        self.success = _BareCounter("tgi_request_success", "Number of successful requests", r)
        self.e2e = Histogram("tgi_request_duration", "Total time spent processing the request (e2e latency)",
                             buckets=TGI_DURATION_BUCKETS, registry=r)
        self.itl = Histogram("tgi_request_mean_time_per_token_duration", "Mean time per token per request",
                             buckets=TGI_DURATION_BUCKETS, registry=r)
        self.ttft = _Nothing()
        self.running_g = Gauge("tgi_batch_current_size", "Current batch size", registry=r)
        self.waiting_g = Gauge("tgi_queue_size", "Current queue size", registry=r)
        self.kv_g = _Nothing()

    def read_replicas(self) -> None:
        # unreadable (missing, mid-write): keep the last known count
        with contextlib.suppress(OSError, ValueError):
            self.replicas = max(0, int(Path(self.args.replicas_file).read_text().strip()))

    def service_s(self) -> float:
        return self.rng.lognormvariate(self.mu, self.sigma) if self.sigma > 0 else math.exp(self.mu)

    def _finish(self, finish: float, arrival: float, start: float) -> None:
        self.e2e.observe(finish - arrival)
        self.itl.observe((finish - start) * (1.0 - self.args.prefill_fraction) / self.args.output_tokens)
        self.success.inc()

    def _start(self, arrival: float, start: float) -> None:
        service = self.service_s()
        self.ttft.observe(start - arrival + self.args.prefill_fraction * service)
        heapq.heappush(self.running, (start + service, arrival, start))

    def kv_usage(self) -> float:
        """Each running request holds 1/kv_requests of a replica's KV cache; the mean over replicas (requests
        spread evenly over them). No replica: 0 (vLLM's gauge of an idle engine)."""
        per_replica = self.args.kv_requests or self.args.concurrency
        if self.replicas <= 0:
            return 0.0
        return min(1.0, len(self.running) / (self.replicas * per_replica))

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
                finish, arrival, started = heapq.heappop(self.running)
                self._finish(finish, arrival, started)
                if self.queue and len(self.running) < capacity and self.queue[0] <= finish:
                    self._start(self.queue.popleft(), finish)
            while self.queue and len(self.running) < capacity:
                arrival = self.queue.popleft()
                self._start(arrival, max(arrival, last))
            self.running_g.set(len(self.running))
            self.waiting_g.set(len(self.queue))
            self.kv_g.set(self.kv_usage())
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

    async def completions(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        body = await request.json()
        n = max(0, int(body.get("max_tokens", 16)))
        pause = self.args.token_ms / 1000.0
        tokens = [f"tok{i}" for i in range(n)]
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            for i, tok in enumerate(tokens):
                if pause:
                    await asyncio.sleep(pause)
                event = {"choices": [{"index": 0, "text": tok}], "token": i, "t": time.time()}
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        else:
            for _ in tokens:
                if pause:
                    await asyncio.sleep(pause)
            resp = web.json_response({"choices": [{"index": 0, "text": " ".join(tokens)}],
                                      "usage": {"completion_tokens": n}, "server": self.args.port})
        self.e2e.observe(time.monotonic() - started)
        self.success.inc()
        return resp

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
    p.add_argument("--engine", choices=("vllm", "sglang", "tgi"), default="vllm", help="whose metric names")
    p.add_argument("--output-tokens", type=int, default=16, help="tokens per request (the ITL observed)")
    p.add_argument("--token-ms", type=float, default=0.0, help="pause before each token of /v1/completions")
    p.add_argument("--kv-requests", type=int, default=0,
                   help="running requests that fill one replica's KV cache (0: --concurrency)")
    return p.parse_args(argv)


async def main(argv: list[str]) -> None:
    disable_created_metrics()  # vLLM's scrape has no *_created series either
    server = Server(parse(argv))
    app = web.Application()
    app.router.add_get("/metrics", server.metrics)
    app.router.add_post("/v1/completions", server.completions)
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
