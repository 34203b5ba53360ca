"""Decision speed: one tick of ``decide()`` for 1,000 models on 2,000 GPUs, on one core, no I/O.

Target (docs/benchmarks.md): the decision for 1,000 models and 2,000 GPUs takes <= 200 ms per tick.

Setup (synthetic but shaped like a real fleet; everything is built before the clock starts):

- **models**: four classes built from the simulator's default annotation values
  (``autoscaler/sim/defaults.py``) and parsed by the one spec parser, with per-model variation of SLO,
  service time, concurrency and cold start:
  ``llm-whole`` (10 %: whole GPUs only, 1 or 2 per replica, TTFT SLO, 2-5 min cold start),
  ``llm-40g`` (25 %: 40 GiB at 3/7 of a GPU: an H100 3g.40gb, a time-slice share or an 80 GB A100 slice),
  ``client-20g`` (25 %: 20 GiB at 2/7, half of them MIG-only), ``fn-small`` (40 %: 4-8 GiB at 0.1-0.15
  of a GPU, half of them time-slice-only);
- **cluster**: heterogeneous nodes of 8 GPUs (``sharing.cluster.nodes_from_spec``), by default
  ``800xH100-80GB:mig,400xH100-80GB,400xA100-80GB:mig,200xA100-40GB:mig,200xL4``, scaled with ``--gpus``;
- **steady state**: each model starts with the replicas its initial load needs for its SLO
  (``capacity.min_replicas_for_slo``, as the simulator's warm start), placed by the core's own packer and
  already Ready;
- **load**: per model a rate series of 10 s samples with ``--history`` hours of it before the first
  tick (the metrics window is its last 600 s); from the first tick 20 % of the models ramp up (x1.5-3
  per 60 ticks, at most x6), 20 % ramp down (x0.3-0.7 per 60 ticks, at most to a tenth), the rest
  wander around their level (slow wave + noise). In-flight requests follow Little's law
  (rate x mean service time).
- **tick**: by default the policy's own tick (slotwise 10 s, HPA 15 s, predictive 180 s ...), rounded up
  to whole 10 s samples, so that every measured tick is one at which every model decides (the core
  starts all models' clocks on the same tick); the window slides by a tick's samples each tick.

Between ticks the plan is **applied** to the simulator's in-memory cluster (``autoscaler.sim.cluster.
SimCluster``: placements, cold starts, drains), so every tick sees the cluster its predecessors left — the
packer works on a filling cluster and scale-downs really free slots. ``--no-apply`` instead keeps the
cluster frozen: every ramping model then asks for (and re-places) its whole shortfall every tick, a
harsher and less realistic load on the packer.

The fleet forecaster (for policies that forecast) is warm-started from ``--history`` hours of the same
load (default 6), as the simulator warm-starts it from a trace's past: a controller in steady state has
been forecasting for hours, and a cold forecaster's wide early quantiles would turn the first forecast
step into a mass scale-up that no running controller sees.

``--lending pods|kueue`` turns the lend stage on (``LendingPolicy`` defaults in that mode, the forecaster's horizon as
``build_core`` sets it for lending): every tick then also works out what the models need over the reclaim horizon
and lends the idle GPUs beyond the buffers (issue 15's target is for the worst tick with lending on).

Only ``decide()`` is timed (CPU: ``time.process_time``; and wall). The first tick is reported apart: it
builds every model's controller state and folds the history into the forecaster. Building the snapshot
and metrics window and applying the plan (the ports' work) are timed apart and printed for reference.

    .venv/bin/python bench/decide_speed.py [--models 1000] [--gpus 2000] [--ticks 60] [--policy slotwise]
        [--lending pods|kueue]
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoscaler.api.plan import LendGpus, PlaceReplica, ReclaimGpus, RemoveReplica, ScaleModel, Shortfall
from autoscaler.api.snapshot import MetricsWindow, ModelMetrics
from autoscaler.api.spec import ModelSpec, parse_mapping, slot_request
from autoscaler.decision.config import CoreConfig
from autoscaler.decision.core import decide
from autoscaler.decision.state import fresh_state
from autoscaler.estimation.capacity import min_replicas_for_slo, profile_from_spec
from autoscaler.estimation.forecast import FleetForecaster
from autoscaler.policies import POLICIES, make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.defaults import CLIENT_DEFAULTS, FUNCTION_DEFAULTS, LLM_DEFAULTS
from sharing.cluster import nodes_from_spec
from sharing.lending import LendingPolicy
from sharing.packer import CostAwarePacker
from sharing.slots import NodeSpec

TARGET_MS = 200.0
# GPU kinds of the default cluster and their share of the GPUs (8 GPUs per node).
CLUSTER_MIX = (
    ("H100-80GB:mig", 0.40),
    ("H100-80GB", 0.20),
    ("A100-80GB:mig", 0.20),
    ("A100-40GB:mig", 0.10),
    ("L4", 0.10),
)


def cluster_spec(gpus: int) -> str:
    """The default heterogeneous cluster scaled to about ``gpus`` GPUs (whole 8-GPU nodes per kind)."""
    parts = []
    for kind, share in CLUSTER_MIX:
        n = max(8, int(round(gpus * share / 8)) * 8)
        parts.append(f"{n}x{kind}")
    return ",".join(parts)


def _spec(name: str, base: dict[str, Any], **over: Any) -> ModelSpec:
    values = {**base, **{k.replace("_", "-"): v for k, v in over.items()}}
    return parse_mapping(name, values)


def make_models(n: int, rng: random.Random) -> tuple[list[ModelSpec], dict[str, str], dict[str, float]]:
    """``n`` model specs, each model's class, and each model's base load (req/s)."""
    specs: list[ModelSpec] = []
    kind: dict[str, str] = {}
    base_rate: dict[str, float] = {}
    for i in range(n):
        u = rng.random()
        if u < 0.10:
            cls = "llm-whole"
            gpus = rng.choice((1, 1, 2))
            service_ms = rng.uniform(2000, 5000)
            s = _spec(f"{cls}-{i}", {k: v for k, v in LLM_DEFAULTS.items() if k != "gpu-memory-gib"},
                      gpus_per_replica=gpus, slot_kinds="whole", service_time_ms=round(service_ms),
                      concurrency=rng.choice((8, 16, 32)), slo_latency_ms=rng.choice((1000, 2000, 3000)),
                      cold_start_seconds=rng.uniform(120, 300))
            per_replica = s.concurrency / s.service_time_s
            rate = per_replica * rng.uniform(0.4, 2.5)
        elif u < 0.35:
            cls = "llm-40g"
            s = _spec(f"{cls}-{i}", LLM_DEFAULTS, gpu_compute_share=round(3 / 7, 4),
                      service_time_ms=round(rng.uniform(1000, 3000)), concurrency=rng.choice((4, 8, 16)),
                      slo_latency_ms=rng.choice((1000, 2000, 4000)), cold_start_seconds=rng.uniform(45, 180))
            rate = s.concurrency / s.service_time_s * rng.uniform(0.3, 3.0)
        elif u < 0.60:
            cls = "client-20g"
            kinds = "mig" if rng.random() < 0.5 else "whole,mig,share"
            service_ms = rng.uniform(100, 800)
            # An e2e SLO must leave room for the service time's own tail (exponential: p99 = 4.6x mean).
            s = _spec(f"{cls}-{i}", CLIENT_DEFAULTS, gpu_compute_share=round(2 / 7, 4), slot_kinds=kinds,
                      service_time_ms=round(service_ms), concurrency=rng.choice((4, 8, 16)),
                      slo_latency_ms=round(service_ms * rng.choice((6, 8, 12))),
                      slo_percentile=rng.choice((90, 95, 99)),
                      cold_start_seconds=rng.uniform(30, 120))
            rate = s.concurrency / s.service_time_s * rng.uniform(0.2, 2.5)
        else:
            cls = "fn-small"
            kinds = "share" if rng.random() < 0.5 else "mig,share"
            service_ms = math.exp(rng.uniform(math.log(10), math.log(500)))
            s = _spec(f"{cls}-{i}", FUNCTION_DEFAULTS, gpu_memory_gib=rng.choice((4, 4, 8)),
                      gpu_compute_share=rng.choice((0.1, 0.125, 0.15)), slot_kinds=kinds,
                      service_time_ms=round(service_ms, 1), slo_latency_ms=round(max(100.0, 5 * service_ms), 1),
                      cold_start_seconds=rng.uniform(10, 60))
            # Most functions are nearly idle, a few are busy.
            rate = s.concurrency / s.service_time_s * min(2.0, rng.paretovariate(1.5) * 0.1)
        specs.append(s)
        kind[s.name] = cls
        base_rate[s.name] = rate
    return specs, kind, base_rate


def load_series(
    specs: Sequence[ModelSpec], base_rate: dict[str, float], pre: int, ticks: int, stride: int, seed: int
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rates (req/s) per model and sample: ``pre`` samples of history, then ``stride`` per tick.

    From the first tick on, 20 % ramp up (exponentially, x1.5-3 per 60 ticks, at most x6) and 20 % down
    (x0.3-0.7 per 60 ticks, at most to a tenth); the rest wander on a slow wave. The ramps' pace is per
    tick, so it depends neither on the number of ticks nor on the tick's length. Multiplicative noise
    (sd 5-15 %) on every sample.
    """
    rng = np.random.default_rng(seed)
    m, n = len(specs), pre + ticks * stride
    steps = np.arange(n) - pre  # < 0: history
    trend = np.empty(m, dtype=object)
    rates = np.empty((m, n))
    ramp_steps = 60 * stride
    for i, s in enumerate(specs):
        u = rng.random()
        progress = np.maximum(steps, 0) / ramp_steps
        if u < 0.2:
            trend[i], level = "up", np.minimum(6.0, np.exp(np.log(rng.uniform(1.5, 3.0)) * progress))
        elif u < 0.4:
            trend[i], level = "down", np.maximum(0.1, np.exp(np.log(rng.uniform(0.3, 0.7)) * progress))
        else:
            period = rng.uniform(30, 360)  # steps
            trend[i] = "steady"
            level = 1.0 + 0.15 * np.sin(2 * np.pi * steps / period + rng.uniform(0, 2 * np.pi))
        noise = rng.lognormal(0.0, rng.uniform(0.05, 0.15), n)
        rates[i] = base_rate[s.name] * level * noise
    mean_s = np.array([profile_from_spec(s).mean_s for s in specs])
    in_flight = rates * mean_s[:, None]
    return rates, in_flight, list(trend)


@dataclass
class Setup:
    specs: list[ModelSpec]
    kind: dict[str, str]
    trend: list[str]
    nodes: list[NodeSpec]
    cluster: SimCluster
    rates: np.ndarray
    in_flight: np.ndarray
    initial_replicas: dict[str, int]
    pre: int  # samples before the first tick
    unplaced_initial: int
    setup_s: float


def build(
    models: int, gpus: int, ticks: int, pre: int, stride: int, seed: int, packer: CostAwarePacker
) -> Setup:
    t0 = time.perf_counter()
    rng = random.Random(seed)
    specs, kind, base_rate = make_models(models, rng)
    nodes = nodes_from_spec(cluster_spec(gpus))
    names = [s.name for s in specs]
    by_name = {s.name: s for s in specs}
    drain = np.array([min(30.0, 4 * s.service_time_s) for s in specs])
    cluster = SimCluster(nodes, names, dict(by_name), drain_s=drain)
    rates, in_flight, trend = load_series(specs, base_rate, pre, ticks, stride, seed)
    # Warm start as the simulator does: the replicas the last history sample needs, placed by the packer
    # (in random order, not biggest first: a fleet grows model by model).
    order = list(range(len(specs)))
    rng.shuffle(order)
    initial: dict[str, int] = {}
    unplaced = 0
    for i in order:
        s = specs[i]
        n = min(max(min_replicas_for_slo(float(rates[i, pre - 1]), profile_from_spec(s)), s.min_replicas),
                s.max_replicas)
        scratch = cluster.inventory.copy()
        req = slot_request(s)
        slots = []
        for r in range(n):
            slot = packer.place(scratch, req)
            if slot is None:
                unplaced += n - r
                break
            scratch.allocate(slot, f"{s.name}-init{r}")
            slots.append(slot)
        cluster.preplace(s.name, slots)
        initial[s.name] = len(slots)
    return Setup(specs, kind, trend, nodes, cluster, rates, in_flight, initial, pre, unplaced,
                 time.perf_counter() - t0)


def metrics_window(
    setup: Setup, k: int, window: int, stride: int, now: float, step_s: float, oracle: bool
) -> MetricsWindow:
    """The window the metrics port would hand the core at tick ``k``: the last ``window`` samples."""
    hi = setup.pre + k * stride
    lo = hi - window
    rates, infl = setup.rates, setup.in_flight
    nxt = min(hi, rates.shape[1] - 1)
    models = {
        s.name: ModelMetrics(
            rate=rates[i, lo:hi],
            in_flight=infl[i, lo:hi],
            future_rate=float(rates[i, nxt]) if oracle else None,
        )
        for i, s in enumerate(setup.specs)
    }
    return MetricsWindow(now=now, step_s=step_s, models=models)


def _pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, math.ceil(q / 100 * len(ys)) - 1))]


def _stats(xs: Sequence[float]) -> str:
    return f"median {statistics.median(xs):7.1f}  p95 {_pct(xs, 95):7.1f}  max {max(xs):7.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=2000, help="about this many GPUs, in 8-GPU nodes of five kinds")
    ap.add_argument("--ticks", type=int, default=60, help="measured ticks, after one warm-up tick")
    ap.add_argument("--policy", default="slotwise", help=f"any registered policy ({', '.join(sorted(POLICIES))})")
    ap.add_argument("--tick", type=float, default=None,
                    help="seconds between decisions, rounded up to whole samples (default: the policy's tick)")
    ap.add_argument("--step", type=float, default=10.0, help="metrics sample step in seconds")
    ap.add_argument("--window", type=float, default=600.0, help="metrics window in seconds")
    ap.add_argument("--history", type=float, default=6.0,
                    help="hours of load history the forecaster is warm-started from (as the simulator does)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-apply", dest="apply", action="store_false",
                    help="do not apply plans: the cluster stays as set up (every ramp re-asks every tick)")
    ap.add_argument("--lending", choices=("off", "pods", "kueue"), default="off",
                    help="the lend stage on, in this mode (LendingPolicy defaults; the forecaster looks as far ahead "
                         "as build_core makes it for lending); off by default")
    args = ap.parse_args(argv)
    if args.models < 1 or args.gpus < 8 or args.ticks < 1 or not args.step > 0:
        ap.error("--models >= 1, --gpus >= 8, --ticks >= 1 and --step > 0 are required")
    if args.tick is not None and not args.tick > 0:
        ap.error("--tick must be > 0")

    policy = make_policy(args.policy)
    step = args.step
    stride = max(1, math.ceil((args.tick if args.tick is not None else policy.tick_s) / step - 1e-9))
    tick = stride * step
    window = max(2, int(math.ceil(args.window / step)))
    packer = CostAwarePacker()
    pre = max(window, int(math.ceil(args.history * 3600 / step)))
    setup = build(args.models, args.gpus, args.ticks + 1, pre, stride, args.seed, packer)
    if args.policy == "static":
        # The static baseline holds what each model was given at the start.
        policy = make_policy(args.policy, replicas_by_model=setup.initial_replicas)
    oracle = policy.instant_start
    if oracle:
        setup.cluster.instant_start = True
    lending = None if args.lending == "off" else LendingPolicy(enabled=True, mode=args.lending)
    if lending is not None:
        setup.cluster.lending = lending
    # (lending as build_core sets it up: pods mode lends whole nodes only)
    config = CoreConfig(policy=policy, packer=packer, lending=lending,
                        lending_whole_nodes_only=lending is not None and lending.mode == "pods")
    forecaster = None
    if policy.uses_forecast:
        # A controller in steady state has been forecasting for hours: warm-start the fleet forecaster
        # from the history, as the simulator does from a trace's past. It folds it in on the first tick.
        # With lending it looks ahead as far as the lend stage does (build_core's horizon).
        forecaster = (FleetForecaster() if lending is None
                      else FleetForecaster(horizon_s=max(300.0, lending.max_reclaim_s + 600.0)))
        forecaster.warm_start({s.name: setup.rates[i, :pre] for i, s in enumerate(setup.specs)}, step)
    state = fresh_state(forecaster=forecaster)
    cluster = setup.cluster
    inv = cluster.inventory

    replicas0 = sum(setup.initial_replicas.values())
    print(f"decide_speed: models={args.models} gpus={inv.gpus_total} nodes={len(setup.nodes)} ticks={args.ticks} "
          f"(+1 warm-up) tick={tick:g}s window={window}x{step:g}s history={args.history:g}h policy={args.policy} "
          f"(policy tick {policy.tick_s:g}s) packer={packer.name} seed={args.seed} "
          f"apply={'yes (SimCluster)' if args.apply else 'no (frozen cluster)'} lending={args.lending}")
    print(f"cluster: {cluster_spec(args.gpus)}")
    mix = Counter(setup.kind.values())
    print("models: " + ", ".join(f"{k} {mix[k]}" for k in ("llm-whole", "llm-40g", "client-20g", "fn-small"))
          + "; load: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(setup.trend).items())))
    print(f"initial: {replicas0} replicas ({setup.unplaced_initial} did not fit), "
          f"{cluster.gpus_allocated():.0f} of {inv.gpus_total} GPU-equivalents held, "
          f"{inv.gpus_in_use()} GPUs in use; setup {setup.setup_s:.1f}s")

    cpu_ms: list[float] = []
    wall_ms: list[float] = []
    ports_ms: list[float] = []
    apply_ms: list[float] = []
    counts: Counter[str] = Counter()
    deciding: list[int] = []
    placed_per_tick: list[int] = []
    warm: tuple[float, float] = (0.0, 0.0)
    for k in range(args.ticks + 1):
        now = k * tick
        p0 = time.perf_counter()
        cluster.advance(now)
        snap = cluster.snapshot(now)
        mw = metrics_window(setup, k, window, stride, now, step, oracle)
        p1 = time.perf_counter()
        c0, w0 = time.process_time(), time.perf_counter()
        decision = decide(snap, mw, state, config)
        c1, w1 = time.process_time(), time.perf_counter()
        state = decision.state
        a0 = time.perf_counter()
        if args.apply and decision.plan.actions:
            cluster.apply(decision.plan)
        a1 = time.perf_counter()
        if k == 0:
            warm = ((c1 - c0) * 1e3, (w1 - w0) * 1e3)
            gc.freeze()  # as the controller does after its first tick (autoscaler/live/controller.py)
            continue
        cpu_ms.append((c1 - c0) * 1e3)
        wall_ms.append((w1 - w0) * 1e3)
        ports_ms.append((p1 - p0) * 1e3)
        apply_ms.append((a1 - a0) * 1e3)
        # Models that decided this tick are next due one policy tick from now.
        due = now + policy.tick_s - 1e-6
        deciding.append(sum(1 for ms in state.models.values() if ms.next_decision_at >= due))
        placed_per_tick.append(sum(1 for a in decision.plan.actions if isinstance(a, PlaceReplica)))
        for a in decision.plan.actions:
            match a:
                case PlaceReplica():
                    counts["placed"] += 1
                case RemoveReplica():
                    counts["removed"] += 1
                case ScaleModel():
                    counts["scale"] += 1
                case Shortfall():
                    counts["shortfall"] += a.missing
                case LendGpus():
                    counts["lent"] += len(a.devices)
                case ReclaimGpus():
                    counts["reclaimed"] += len(a.devices)

    n = len(cpu_ms)
    print(f"warm-up tick (controller state + forecaster warm start): cpu {warm[0]:.1f} ms  wall {warm[1]:.1f} ms")
    print(f"decide() over {n} ticks, ms per tick   cpu: {_stats(cpu_ms)}")
    print(f"                                      wall: {_stats(wall_ms)}")
    print(f"per model-decision: {statistics.median(cpu_ms) * 1e3 / max(1, statistics.median(deciding)):.1f} us cpu "
          f"(median {statistics.median(deciding):.0f} models decide per tick)")
    print(f"not timed (ports): snapshot+window median {statistics.median(ports_ms):.1f} ms, "
          f"apply median {statistics.median(apply_ms):.1f} ms")
    print(f"plans: {counts['placed']} replicas placed, {counts['removed']} removed, {counts['scale']} scale actions, "
          f"{counts['shortfall']} replicas unplaceable over {n} ticks (per tick: {counts['placed'] / n:.1f} placed, "
          f"{counts['removed'] / n:.1f} removed)")
    if lending is not None:
        print(f"lending ({lending.mode}): {counts['lent']} GPUs lent, {counts['reclaimed']} reclaimed over {n} ticks; "
              f"{len(cluster.lent)} lent at the end")
    if len(set(placed_per_tick)) > 1:
        # What a tick costs without placements, and what each placement adds (least squares over the ticks).
        slope, base = np.polyfit(placed_per_tick, cpu_ms, 1)
        print(f"cpu per tick ~= {base:.1f} ms + {slope:.2f} ms x replicas placed "
              f"(fit over {n} ticks; placements per tick {min(placed_per_tick)}-{max(placed_per_tick)})")
    print(f"end: {cluster.gpus_allocated():.0f} of {inv.gpus_total} GPU-equivalents held, "
          f"{inv.gpus_in_use()} GPUs in use")
    worst = max(cpu_ms)
    verdict = "PASS" if worst <= TARGET_MS else "FAIL"
    print(f"target <= {TARGET_MS:.0f} ms cpu per tick (every measured tick): {verdict} (max {worst:.1f} ms, "
          f"p95 {_pct(cpu_ms, 95):.1f} ms; warm-up {warm[0]:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
