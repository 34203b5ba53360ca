"""The lower bound on GPU-hours at the SLO (issue 15, item 2): the cheapest replica schedule that meets every
model-minute's declared percentile given the real arrivals and each model's cold start, served by the same engine
(``make_engine(config.mode, ...)``) the policies are scored with.

Construction (:func:`lower_bound`):

1. **Serving schedule.** Block by block (a tick, or a minute's ticks), per model, the fewest routable replicas for
   which the engine, serving the block's true arrivals from the state the schedule so far left, meets the SLO.
   Candidates are tried on forks of the engine (:func:`fork`), all models at once (the engine is per-model
   independent), galloping from the previous block's answer and then bisecting (:func:`fewest`). Three rules:

   - ``"tick"``: every tick meets on its own (``within_t(n) >= p x arrivals_t``), hence every minute;
   - ``"minute"``: a tick may spend the slack the earlier ticks of its minute left (the fewest ``n`` with
     ``within(minute so far) + within_t(n) >= p x arrivals(minute so far + tick)``); the last tick closes the minute;
   - ``"level"``: one count held over each scored minute, the fewest that meets the minute.

   Each gives a schedule that meets every minute it can; none is the cheapest everywhere (measured on the demo and
   ServeGen: with a cold start, dips inside a cold start save nothing and the minute rule's closing ticks add peaks,
   so "tick" or "level" wins; without one, "minute" wins). The default (``rule="auto"``) takes per model the cheaper
   of "tick" and "level" with a cold start, "minute" without: the models are independent, so the mix is a schedule.
   Where even ``max_replicas`` cannot meet a block, it is sized at the **knee**: the fewest replicas whose
   within-SLO share and completion share are both within ``knee_tol`` of what ``max_replicas`` achieves (more
   replicas stop helping). Bounds: ``[min_replicas, max_replicas]``; during the burn-in (unscored) at least the warm
   start, as every policy holds it there; before a cold start has elapsed no more than the warm start (nothing else
   can be Ready yet). A model with an invalid spec is left unmanaged, as the simulator does: 0 replicas.
2. **Clairvoyant cold start.** Replica level ``k`` is held wherever ``n_t >= k`` and over the ``L = ceil(cold_start /
   tick)`` ticks before each tick that needs it (starting: held, not serving), so a gap of at most ``L`` ticks is
   bridged (keeping the replica costs no more than restarting it) and a longer one pays exactly one cold start. The
   held count is therefore the forward running maximum of ``n`` over ``L + 1`` ticks (:func:`held_replicas`).
   Warm-start replicas are Ready at 0; a lead that falls before 0 is in the burn-in, which is not scored.
   ``instant_start=True`` gives the bound without cold start (``L = 0``), the reference for instant-start policies.
3. **GPU-hours** over the scored ticks (the burn-in rule of :func:`autoscaler.sim.run.simulate`, mirrored in
   :func:`scored_period`): held replicas x the GPU fraction of the replica's slot x the tick. The slot: per model,
   each of :func:`slot_options` (every legal candidate of the cost-aware packer on an empty node of each of the
   cluster's GPU kinds, as ``default_cluster`` probes, less those another beats on both GPUs held and slot speed)
   gets its own pass of the engine at its speed, and the model takes, of those meeting the most requests' minutes,
   the cheapest. Without slot speeds (every slot at speed 1) that is the smallest slot it fits.

What makes it a bound, and where it is not exact: it assumes that more replicas never lower a tick's within-SLO
share in the engine (tested for the fluid engine; the DES is random and only nearly so), that holding more replicas
earlier never makes a later tick need more, and the greedy rules are cheapest block by block, not over the whole run:
a policy that misses a tick early in a minute and makes up for it later, or serves with replicas a bound's schedule
holds idle (bridging a gap, it routes only what the tick needs), could in principle hold less. Replicas leave at once
(a policy's drain holds its slot); the cluster's placement and the scenario's events are not modelled. The claim the
tests check: no policy whose SLO-meeting minutes cover every attainable minute comes out below it (instant-start
policies: below the bound without a cold start).

Cost: a pass of the engine per rule and slot option, each ~2.5-3 engine steps a tick (forks; the chosen counts'
states are merged from the forks, :meth:`_Trials.commit`); on the demo about 3x the oracle policy's run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.estimation.capacity import min_replicas_for_slo
from autoscaler.sim.engines import make_engine
from autoscaler.sim.fluid import FluidEngine
from autoscaler.sim.queueing import QueueEngine, TickStats
from autoscaler.sim.run import SimConfig, SimResult, scored_period
from autoscaler.sim.workload import SimWorkload, served_as
from sharing.slots import NodeSpec

RULES = ("tick", "minute", "level")
AUTO = {False: ("tick", "level"), True: ("minute",)}  # rule="auto", by instant_start
KNEE_TOL = 0.005  # a knee's within-SLO (and completion) share is within this of what max_replicas achieves


@dataclass(frozen=True)
class LowerBound:
    """The bound and the schedule behind it (module docstring). Arrays are (M, ...) in ``models`` order."""

    models: tuple[str, ...]
    gpu_hours: float  # over the scored period
    per_model_gpu_hours: dict[str, float]
    replicas: np.ndarray  # (M, n_ticks) replicas held (starting or serving)
    serving: np.ndarray  # (M, n_ticks) of which routable: the schedule the engine served
    attainable: np.ndarray  # (M, n_minutes) bool: the model-minutes the schedule meets (no requests: True)
    minute_arrivals: np.ndarray  # (M, n_minutes) requests per scored minute
    minute_within: np.ndarray  # (M, n_minutes) of which within the SLO latency
    unattainable_reason: dict[str, str]  # per model with an unattainable minute: why, with the numbers
    knee_replicas: dict[str, int]  # per model sized at the knee somewhere: the most replicas the knee took
    gpu_fraction: dict[str, float]  # GPU-equivalents one replica holds, in the slot chosen
    slot: dict[str, SlotOption]  # per model, the slot its schedule is for
    burn_in_s: float
    tick_s: float
    rule: dict[str, str]  # per model, the rule whose schedule it took
    instant_start: bool
    wall_s: float
    engine_steps: int  # engine steps taken (forks included): what the bound cost


def warm_start_replicas(workload: SimWorkload, dt: float) -> np.ndarray:
    """Replicas each model starts with in :func:`autoscaler.sim.run._warm_start` (its sizing, mirrored; placement
    is assumed to succeed, as on the default cluster); 0 for a model with an invalid spec (left unmanaged)."""
    window = max(dt, 300.0)
    first = workload.arrivals_per_tick(window)[:, 0] / window
    profiles = workload.profiles
    out = np.zeros(len(workload.models), dtype=np.int64)
    for i, name in enumerate(workload.models):
        spec = workload.specs[name]
        if isinstance(spec, ModelSpec):
            n = max(min_replicas_for_slo(float(first[i]), profiles[name]), spec.min_replicas)
            out[i] = min(n, spec.max_replicas)
    return out


@dataclass(frozen=True)
class SlotOption:
    """A slot one replica fits: what it holds and how fast it serves there."""

    kind: str  # "<GPU model>/<slot type>", e.g. "H100-80GB/3g.40gb"
    fraction: float  # GPU-equivalents held (the unit of gpu_hours: Slot.gpu_fraction)
    speed: float  # relative to the reference GPU the service times describe (1.0 without slot speeds)


def slot_options(spec: ModelSpec, nodes: Sequence[NodeSpec], with_speeds: bool = True) -> tuple[SlotOption, ...]:
    """The slots worth considering for one replica of ``spec``: every legal candidate of the cost-aware packer on an
    empty node of each GPU kind (and MIG mode) of ``nodes``, as ``default_cluster`` probes, at its slot speed, less
    those another one beats on both counts (as few GPUs and as fast); the fewest GPUs first. A policy's packer picks
    among the same slots (on a node others share, joining another model's time-slice share could hold less: no
    bundled default spec allows it). Nothing fits: the spec's whole GPUs at speed 1. ``with_speeds=False``: every
    slot at speed 1 (engines without slot speeds)."""
    from sharing.packer import CostAwarePacker
    from sharing.slots import Inventory

    slot_type = speed_of = None
    if with_speeds:  # slot speeds (issue 15, item 5); without them every slot serves at the reference speed
        with contextlib.suppress(ImportError):
            from sharing.slot_speed import slot_type, speed_of
    kinds: dict[tuple[str, bool], NodeSpec] = {}
    for node in nodes:
        if node.gpu_count:
            kinds.setdefault((node.gpu_model, node.mig_enabled), node)
    req = slot_request(spec)
    packer = CostAwarePacker()
    pods = spec.pods_per_replica  # a replica that is a group of pods holds one such slot per pod
    found: list[SlotOption] = []
    for node in kinds.values():
        inv = Inventory.from_nodes([node])
        for _, slot in packer.candidates(inv, req):
            held = slot.gpu_fraction if pods == 1 else slot.gpu_fraction * pods
            if speed_of is None or slot_type is None:
                found.append(SlotOption(f"{slot.gpu_model}/{slot.kind}", held, 1.0))
            else:
                found.append(SlotOption(f"{slot.gpu_model}/{slot_type(slot)}", held,
                                        speed_of(slot, spec.slot_speeds, inv.catalog, spec.gpu_compute_share)))
    front: list[SlotOption] = []
    for o in sorted(found, key=lambda o: (o.fraction, -o.speed)):
        if not front or o.speed > front[-1].speed + 1e-12:
            front.append(o)
    return tuple(front) or (SlotOption("none", float(spec.gpus_per_replica * pods), 1.0),)


def engine_takes_speeds(mode: str) -> bool:
    """Whether the serving engine of ``mode`` serves replicas at their slot speeds (``step(..., speeds)``)."""
    from autoscaler.sim.des import DesEngine

    cls = {"fluid": FluidEngine, "des": DesEngine}.get(mode)
    return cls is not None and "speeds" in inspect.signature(cls.step).parameters


def replica_gpu_fraction(spec: ModelSpec, nodes: Sequence[NodeSpec]) -> float:
    """GPU-equivalents of the smallest slot one replica of ``spec`` fits (:func:`slot_options`; a group of pods:
    every pod's)."""
    return slot_options(spec, nodes)[0].fraction


# Arrays of FluidEngine that never change after construction: a fork shares them, and copies every other array
# (so a state array added later is copied, not shared by mistake).
_FLUID_SHARED = frozenset({"_c", "_mean", "_scv", "_q_frac", "_rho_tab", "_slope_tab", "_rows2", "_c2", "_scv2",
                           "_lat_q", "_t", "_mi", "_budget", "_occ", "_budget_to", "_cum"})
_DES_SHARED = ("workload", "_t", "_mi", "_occ", "_lat", "_tail", "_slo", "_pct")


def fork(engine: QueueEngine) -> QueueEngine:
    """An independent copy of ``engine``'s state: stepping it leaves ``engine`` as it was. The fluid engine copies
    its state arrays only (tens of µs); any other engine is deep-copied, sharing the workload and its request
    arrays (the DES copies its per-request records: O(requests) a fork)."""
    if type(engine) is FluidEngine:
        new = copy.copy(engine)
        for name, value in vars(engine).items():
            if isinstance(value, np.ndarray) and name not in _FLUID_SHARED:
                setattr(new, name, value.copy())
        return new
    memo = {id(v): v for v in (getattr(engine, a, None) for a in _DES_SHARED) if v is not None}
    return copy.deepcopy(engine, memo)


def held_replicas(serving: np.ndarray, lead_ticks: np.ndarray) -> np.ndarray:
    """Replicas held per tick when each model's replica levels start ``lead_ticks`` ticks before they serve and are
    kept over gaps no longer than that: the running maximum of ``serving`` over ticks ``[t, t + lead]`` (step 2 of
    the module docstring), by doubling (log(lead) passes)."""
    out = np.array(serving, dtype=np.int64, copy=True)

    def fold(row: np.ndarray, shift: int) -> None:  # row[t] = max(row[t], row[t + shift])
        if 0 < shift < len(row):
            row[:-shift] = np.maximum(row[:-shift], row[shift:])

    for i, lead in enumerate(np.asarray(lead_ticks, dtype=np.int64)):
        width = int(lead) + 1
        span = 1
        while span * 2 <= width:  # out[i, t] = max over [t, t + span)
            fold(out[i], span)
            span *= 2
        fold(out[i], width - span)  # [t, t + span) and [t + width - span, t + width) cover [t, t + width)
    return out


Ok = Callable[[np.ndarray, TickStats], np.ndarray]


def fewest(trial: Callable[[np.ndarray], TickStats], lo: np.ndarray, hi: np.ndarray, guess: np.ndarray, ok: Ok,
           todo: np.ndarray) -> np.ndarray:
    """Per model (where ``todo``), the fewest ``n`` in ``[lo, hi]`` with ``ok(n)``, ``hi + 1`` where none: ``ok`` is
    monotone in ``n``. One ``trial`` (an engine step on a fork) per round for all models at once: the first round at
    ``guess``, then galloping away from it until bracketed, then bisection. Where not ``todo`` the answer is ``guess``
    (clipped to ``[lo, hi]``)."""
    guess = np.clip(guess, lo, hi)
    bad = np.where(todo, lo - 1, guess - 1)  # largest n known not ok (lo - 1: assumed)
    good = np.where(todo, hi + 1, guess)  # smallest n known ok (hi + 1: none known yet)
    step = np.ones_like(lo)
    first = True
    while True:
        active = good - bad > 1
        if not active.any():
            return good
        if first:
            cand = guess
        else:
            up = good > hi  # nothing ok yet: gallop up from the last bad
            down = (bad < lo) & ~up  # nothing bad yet: gallop down from the last good
            mid = (bad + good) // 2
            cand = np.where(up, np.minimum(bad + step, hi), np.where(down, np.maximum(good - step, lo), mid))
            step = np.where(up | down, step * 2, step)
        cand = np.where(active, cand, np.minimum(good, hi))  # settled models serve their answer
        yes = ok(cand, trial(cand))
        good = np.where(active & yes, cand, good)
        bad = np.where(active & ~yes, cand, bad)
        first = False


class _Trials:
    """Trials of one block of ticks (one tick, or a minute's for the "level" rule) on forks of the engine, a
    replica count held over the block; keeps what each model saw at its ceiling (for the knee), and the forks, so
    that the chosen counts' states can be taken from them instead of served again (:meth:`commit`)."""

    def __init__(self, engine: QueueEngine, starts: Sequence[float], dt: float, ceiling: np.ndarray,
                 speed: np.ndarray | None) -> None:
        self.engine, self.starts, self.dt, self.ceiling, self.speed = engine, starts, dt, ceiling, speed
        m = len(ceiling)
        self.steps = 0
        self.arrivals = np.zeros(m)
        self.cap_within = np.zeros(m)
        self.cap_done = np.zeros(m)
        self.cap_latency = np.full(m, np.nan)
        self.tried: list[tuple[np.ndarray, QueueEngine, TickStats]] = []

    def __call__(self, n: np.ndarray) -> TickStats:
        e = fork(self.engine)
        s = serve_block(e, self.starts, self.dt, n, self.speed)
        self.steps += len(self.starts)
        self.tried.append((n, e, s))
        self.arrivals = s.arrivals
        at = n == self.ceiling
        self.cap_within = np.where(at, s.within_slo, self.cap_within)
        self.cap_done = np.where(at, s.within_timeout, self.cap_done)
        self.cap_latency = np.where(at, s.latency_at_slo_pct, self.cap_latency)
        return s

    def commit(self, n: np.ndarray) -> tuple[QueueEngine, np.ndarray, np.ndarray]:
        """The engine after serving the block with ``n``, and the block's arrivals and within-SLO counts: merged
        per model from the trials that tried its count (the fluid engine), else served again."""
        pick = np.full(len(n), -1)
        for i, (cand, _, _) in enumerate(self.tried):
            pick = np.where(cand == n, i, pick)
        merged = _merge([e for _, e, _ in self.tried], pick) if (pick >= 0).all() else None
        if merged is None:
            s = serve_block(self.engine, self.starts, self.dt, n, self.speed)
            self.steps += len(self.starts)
            return self.engine, s.arrivals, s.within_slo
        rows = np.arange(len(n))
        arrivals = np.stack([s.arrivals for _, _, s in self.tried])[pick, rows]
        within = np.stack([s.within_slo for _, _, s in self.tried])[pick, rows]
        return merged, arrivals, within


def _merge(engines: list[QueueEngine], pick: np.ndarray) -> QueueEngine | None:
    """A fluid engine whose model ``i`` is in the state of ``engines[pick[i]]`` (the engine is per-model
    independent: each state array is per model, or per cohort and model with the two cohorts stacked); None for
    another engine, or a state array of another shape."""
    first = engines[0]
    if type(first) is not FluidEngine:
        return None
    m = len(pick)
    new = copy.copy(first)
    for name, value in vars(first).items():
        if not isinstance(value, np.ndarray) or name in _FLUID_SHARED:
            continue
        if value.shape[:1] == (m,):
            rows, src = np.arange(m), pick
        elif value.shape[:1] == (2 * m,):
            rows, src = np.arange(2 * m), np.concatenate([pick, pick])
        else:
            return None
        setattr(new, name, np.stack([getattr(e, name) for e in engines])[src, rows])
    return new


class _Speeds:
    """Every routable replica of model ``i`` at ``speed[i]`` (the engines' RoutableSpeeds)."""

    def __init__(self, n: np.ndarray, speed: np.ndarray) -> None:
        self._n, self._speed = n, speed
        self.capacity = n * speed

    def speeds_of(self, i: int) -> list[float]:
        return [float(self._speed[i])] * int(self._n[i])


def serve_block(engine: QueueEngine, starts: Sequence[float], dt: float, n: np.ndarray,
                speed: np.ndarray | None = None) -> TickStats:
    """Step ``engine`` over the ticks starting at ``starts`` with ``n`` routable replicas per model at ``speed``
    (None: the reference speed, the engines' path without speeds); the counts summed and the latency at the SLO
    percentile the worst of the ticks' (the other fields are the last tick's)."""
    routable = np.asarray(n, dtype=np.float64)
    speeds = _Speeds(routable, speed) if speed is not None else None
    out: TickStats | None = None
    for t0 in starts:
        s = engine.step(t0, dt, routable) if speeds is None else engine.step(t0, dt, routable, speeds)
        out = s if out is None else dataclasses.replace(
            s, arrivals=out.arrivals + s.arrivals, within_slo=out.within_slo + s.within_slo,
            within_timeout=out.within_timeout + s.within_timeout,
            latency_at_slo_pct=np.fmax(out.latency_at_slo_pct, s.latency_at_slo_pct))
    assert out is not None
    return out


def _meets(p: np.ndarray, a0: np.ndarray, w0: np.ndarray) -> Ok:
    """The SLO test of a trial: with ``a0`` requests, ``w0`` of them within, already in the minute (0: tick rule)."""
    def ok(n: np.ndarray, s: TickStats) -> np.ndarray:
        return (s.arrivals <= 0) | (w0 + s.within_slo >= p * (a0 + s.arrivals))

    return ok


def _near_ceiling(trials: _Trials, tol: float) -> Ok:
    """The knee test: within-SLO and completed shares within ``tol`` of what the ceiling achieved."""
    def ok(n: np.ndarray, s: TickStats) -> np.ndarray:
        slack = tol * s.arrivals
        return (s.within_slo >= trials.cap_within - slack) & (s.within_timeout >= trials.cap_done - slack)

    return ok


@dataclass
class _Knees:
    """What the bound saw at max_replicas on the ticks sized at the knee, per model (for the reasons)."""

    count: np.ndarray
    most: np.ndarray  # the most replicas a knee took
    latency: np.ndarray  # the worst latency at the SLO percentile with max_replicas
    share: np.ndarray  # the lowest within-SLO share with max_replicas


def _bounds(workload: SimWorkload, warm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per model: min and max replicas and the managed mask (invalid specs: fixed at the warm start, i.e. 0)."""
    lo = np.empty(len(workload.models), dtype=np.int64)
    hi = np.empty_like(lo)
    managed = np.zeros(len(lo), dtype=bool)
    for i, name in enumerate(workload.models):
        spec = workload.specs[name]
        if isinstance(spec, ModelSpec):
            lo[i], hi[i], managed[i] = spec.min_replicas, spec.max_replicas, True
        else:
            lo[i] = hi[i] = warm[i]
    return lo, hi, managed




def _blocks(config: SimConfig, workload: SimWorkload, rule: str) -> list[tuple[int, int, int]]:
    """``(first tick, end tick, scored minute or -1)`` per block the schedule is chosen for: one tick each, except
    that the "level" rule holds one count over each scored minute's ticks."""
    burn_in, first_scored, n_ticks, n_min = scored_period(workload, config)
    dt = config.tick_s
    out: list[tuple[int, int, int]] = [(k, k + 1, -1) for k in range(first_scored)]
    for k in range(first_scored, n_ticks):
        j = min(int((k * dt - burn_in) // 60.0), n_min - 1)
        if rule == "level" and out and out[-1][2] == j:
            out[-1] = (out[-1][0], k + 1, j)
        else:
            out.append((k, k + 1, j))
    return out


def _block_bounds(lo: np.ndarray, hi: np.ndarray, warm: np.ndarray, managed: np.ndarray, lead: np.ndarray,
                  last: float, dt: float, scored: bool) -> tuple[np.ndarray, np.ndarray]:
    """A block's replica range (module docstring, step 1); ``last``: the start of its last tick."""
    b_lo = lo if scored else np.where(managed, np.maximum(lo, warm), lo)  # the burn-in holds the warm start
    young = last < lead * dt - 1e-9  # no cold start elapsed yet: only the warm start can be Ready
    b_hi = np.where(young, np.minimum(hi, b_lo), hi)
    return np.minimum(b_lo, b_hi), b_hi


@dataclass(frozen=True)
class _Schedule:
    """One rule's serving schedule and what it met (step 1 of the module docstring)."""

    serving: np.ndarray  # (M, n_ticks)
    arrivals: np.ndarray  # (M, n_minutes), scored minutes
    within: np.ndarray  # (M, n_minutes)
    knees: _Knees
    steps: int


def _serve(workload: SimWorkload, config: SimConfig, rule: str, knee_tol: float, warm: np.ndarray,
           lead: np.ndarray, speed: np.ndarray) -> _Schedule:
    """Step 1 of the module docstring for one rule, every replica of model ``i`` at ``speed[i]``."""
    at_speed = None if np.all(speed == 1.0) else speed
    dt = config.tick_s
    _, _, n_ticks, n_min = scored_period(workload, config)
    m = len(workload.models)
    engine = make_engine(config.mode, workload, dt, seed=config.seed)
    set_timeout = getattr(engine, "set_request_timeout", None)
    if set_timeout is not None:
        set_timeout(config.request_timeout_s)
    p = workload.queue.percentile / 100.0
    lo, hi, managed = _bounds(workload, warm)
    serving = np.zeros((m, n_ticks), dtype=np.int64)
    arrivals = np.zeros((m, n_min))
    within = np.zeros((m, n_min))
    knees = _Knees(np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64), np.full(m, np.nan), np.ones(m))
    none = np.zeros(m)
    prev = warm.copy()
    knee = np.zeros(m, dtype=bool)
    steps = 0
    for k0, k1, j in _blocks(config, workload, rule):
        starts = [k * dt for k in range(k0, k1)]
        b_lo, b_hi = _block_bounds(lo, hi, warm, managed, lead, starts[-1], dt, j >= 0)
        slack = j >= 0 and rule == "minute"
        trials = _Trials(engine, starts, dt, b_hi, at_speed)
        meets = _meets(p, arrivals[:, j] if slack else none, within[:, j] if slack else none)
        # A model at its knee last time is tried at its ceiling first: one trial says whether it still is.
        n = fewest(trials, b_lo, b_hi, np.where(knee, b_hi, prev), meets, b_hi > b_lo)
        knee = n > b_hi
        if knee.any():
            n = np.where(knee, fewest(trials, b_lo, b_hi, prev, _near_ceiling(trials, knee_tol), knee), n)
            if j >= 0:
                share = trials.cap_within / np.maximum(trials.arrivals, 1e-300)
                knees.count += knee
                knees.most = np.where(knee, np.maximum(knees.most, n), knees.most)
                knees.latency = np.where(knee, np.fmax(knees.latency, trials.cap_latency), knees.latency)
                knees.share = np.where(knee, np.minimum(knees.share, share), knees.share)
        engine, got, met = trials.commit(n)
        steps += trials.steps
        serving[:, k0:k1] = n[:, None]
        prev = n
        if j >= 0:
            arrivals[:, j] += got
            within[:, j] += met
    return _Schedule(serving, arrivals, within, knees, steps)


def minutes_met(arrivals: np.ndarray, within: np.ndarray, percentile: np.ndarray) -> np.ndarray:
    """(M, n_minutes) bool: the minute met its SLO (the scorecard's rule: its share of requests within the SLO
    latency is at least the declared percentile); a minute without requests counts as met."""
    has = arrivals > 0
    frac = np.divide(within, arrivals, out=np.ones_like(within, dtype=np.float64), where=has)
    return frac >= (np.asarray(percentile, dtype=np.float64)[:, None] / 100.0) - 1e-9


def covers(result: SimResult, bound: LowerBound) -> bool:
    """Whether a run met every model-minute the bound's schedule meets (the minutes both scored)."""
    met = minutes_met(result.minute_arrivals, result.minute_within, result.slo_percentile)
    n = min(met.shape[1], bound.attainable.shape[1])
    return bool(met[:, :n][bound.attainable[:, :n]].all())


def _reasons(workload: SimWorkload, attainable: np.ndarray, arrivals: np.ndarray, knees: list[_Knees],
             choice: np.ndarray) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, name in enumerate(workload.models):
        missed = int((~attainable[i] & (arrivals[i] > 0)).sum())
        if not missed:
            continue
        of = f"{missed} of {int((arrivals[i] > 0).sum())} minutes unattainable"
        spec = workload.specs[name]
        k = knees[choice[i]]
        if not isinstance(spec, ModelSpec):
            out[name] = f"{of}: invalid spec ({spec}), left unmanaged with no replicas, as the simulator does"
        elif k.count[i]:
            lat = float(k.latency[i])
            said = f"{lat:.1f} s" if math.isfinite(lat) else "unbounded"
            out[name] = (f"latency at p{spec.slo_percentile:g} is {said} with {spec.max_replicas} replicas vs SLO "
                         f"{spec.slo_latency_s:g} s ({k.share[i]:.1%} within it): {of}; sized at the knee, "
                         f"at most {int(k.most[i])} replicas")
        else:
            out[name] = f"{of} although no block needed more than max_replicas ({spec.max_replicas})"
    return out


def lower_bound(workload: SimWorkload, nodes: Sequence[NodeSpec], config: SimConfig | None = None,
                rule: str = "auto", instant_start: bool = False, knee_tol: float = KNEE_TOL) -> LowerBound:
    """The lower bound of the module docstring for ``workload`` on a cluster of ``nodes`` (which decide the slots a
    replica can have) under ``config`` (tick, mode, seed, burn-in, request timeout; lending and events are ignored).
    ``rule``: one of :data:`RULES`, or "auto" (per model the cheapest of :data:`AUTO`'s). ``instant_start``: no cold
    start (the bound for instant-start policies such as the oracle). Per model, the cheapest of its rules and
    :func:`slot_options` (one pass of the engine for each: slower slots need more replicas of fewer GPUs)."""
    if rule != "auto" and rule not in RULES:
        raise ValueError(f"unknown rule {rule!r} (known: auto, {', '.join(RULES)})")
    rules = AUTO[instant_start] if rule == "auto" else (rule,)
    cfg = config or SimConfig()
    wall0 = time.perf_counter()
    dt = cfg.tick_s
    models = workload.models
    rows = np.arange(len(models))
    burn_in, first_scored, _, _ = scored_period(workload, cfg)
    good = served_as(workload.specs)
    warm = warm_start_replicas(workload, dt)
    lead = np.array([0 if instant_start else math.ceil(good[x].cold_start_s / dt - 1e-9) for x in models],
                    dtype=np.int64)
    with_speeds = engine_takes_speeds(cfg.mode)
    options = [slot_options(good[x], nodes, with_speeds) for x in models]
    plans: list[tuple[str, list[SlotOption], _Schedule]] = []
    for k in range(max(len(o) for o in options)):
        slot = [o[min(k, len(o) - 1)] for o in options]  # a model with fewer options repeats its last
        speed = np.array([o.speed for o in slot])
        plans += [(r, slot, _serve(workload, cfg, r, knee_tol, warm, lead, speed)) for r in rules]
    helds = [held_replicas(pl[2].serving, lead) for pl in plans]
    frac = np.stack([[o.fraction for o in pl[1]] for pl in plans])
    hours = np.stack([h[:, first_scored:].sum(axis=1) for h in helds]) * frac * dt / 3600.0  # (plans, M)
    # Per model, of the plans that meet the most requests' minutes (a slot too slow for the SLO meets fewer), the
    # cheapest; ties: the first (fewest GPUs a replica, then AUTO's order).
    p = workload.queue.percentile
    served = np.stack([(pl[2].arrivals * minutes_met(pl[2].arrivals, pl[2].within, p)).sum(axis=1) for pl in plans])
    best = served >= served.max(axis=0) - 1e-6 * np.maximum(served.max(axis=0), 1.0)
    choice = np.argmin(np.where(best, hours, np.inf), axis=0)

    def pick(arrays: list[np.ndarray]) -> np.ndarray:
        return np.stack(arrays)[choice, rows]

    model_h = hours[choice, rows]
    arrivals = pick([pl[2].arrivals for pl in plans])
    within = pick([pl[2].within for pl in plans])
    attainable = minutes_met(arrivals, within, p)
    knees = [pl[2].knees for pl in plans]
    chosen = {x: plans[choice[i]][1][i] for i, x in enumerate(models)}
    return LowerBound(
        models=models,
        gpu_hours=float(model_h.sum()),
        per_model_gpu_hours={x: float(model_h[i]) for i, x in enumerate(models)},
        replicas=pick(helds),
        serving=pick([pl[2].serving for pl in plans]),
        attainable=attainable,
        minute_arrivals=arrivals,
        minute_within=within,
        unattainable_reason=_reasons(workload, attainable, arrivals, knees, choice),
        knee_replicas={x: int(knees[choice[i]].most[i]) for i, x in enumerate(models) if knees[choice[i]].count[i]},
        gpu_fraction={x: o.fraction for x, o in chosen.items()},
        slot={x: o for x, o in chosen.items()},
        burn_in_s=burn_in,
        tick_s=dt,
        rule={x: plans[choice[i]][0] for i, x in enumerate(models)},
        instant_start=instant_start,
        wall_s=time.perf_counter() - wall0,
        engine_steps=sum(pl[2].steps for pl in plans),
    )
