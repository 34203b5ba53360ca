"""Exact placement of a batch of MIG replicas on a small cluster: a per-device MILP, the heuristic as fallback.

The greedy :class:`~sharing.packer.CostAwarePacker` places one replica at a time, so on a handful of GPUs it
often opens one GPU more than needed (one GPU is +11-20% there). For instances of up to ``max_devices``
candidate GPUs the placement of a whole batch is instead read off a MILP solved by HiGHS
(``scipy.optimize.milp``) within a work limit (``DEFAULT_NODE_LIMIT`` branch-and-bound nodes a solve, so the same
instance gets the same placement on any machine), under a wall-clock safety cut. Per candidate device ``d`` (MIG
on, not held whole):

- ``w[d, p, s]`` binary: a new MIG instance of profile ``p`` at legal start ``s`` (``MigProfile.placements``);
- ``a[c, d, p]`` integer: replicas of class ``c`` (one request shape; a spread model's replicas form their
  own class) that use a profile-``p`` instance on ``d``;
- ``u[d]`` binary: the device is used (fixed on for devices that already hold something);
- ``q[c]``: replicas of class ``c`` left unplaced, ``v[m]``: model ``m``'s spread given up.

Constraints: each memory slice of ``d`` is covered by at most one instance, counting the instances already
there (existing allocations and pinned instances are kept exactly as they are), and only on a used device;
compute slices and each profile's ``max_count`` per device; replicas of profile ``p`` on ``d`` at most its new
instances plus its free pinned ones; a replica only on a profile with enough memory and compute; every replica
placed or counted in ``q``. Anti-affinity as the packer keeps it (and as the mig-bench's LB+AA bound assumes):
a model with two or more replicas (those already running included) never has all of them on one node when
the nodes that could hold it are several, else never all on one device -- unless ``v[m]`` gives the spread
up. The objective is lexicographic through its weights: fewest unplaced replicas, then fewest spreads given up,
then fewest devices used, then (tie-breaks summing below one device) the cheapest devices and slots.

Identical devices of one node that are empty are interchangeable, so they are opened in order (symmetry
breaking, which keeps the solve fast without changing the optimum).

On a small cluster whose candidate GPUs are all idle (a batch planned from scratch), two layout-count models
come first (:func:`solve_aggregated`: how many GPUs run each maximal layout, per GPU kind, then per node, the
latter exact with anti-affinity); each is realised on devices and taken as it stands when it keeps every spread
(it then meets a lower bound), else its optimum is a floor for the next, which lets HiGHS stop on reaching it.

Beyond ``max_devices`` candidate GPUs, on a cluster whose candidate GPUs are all idle (a batch planned from
scratch), :func:`solve_aggregated` solves the layout-count model instead (how many GPUs of each kind run each
maximal layout; the model of the mig-bench's bound, whose size does not grow with the cluster) and realises it
on devices, spreading each model's replicas over nodes and devices.

The exact placement is used only when HiGHS finds a solution within its limits and that solution is no worse
than the heuristic's, compared as the objective ranks (fewer unplaced replicas, then fewer spreads broken,
then fewer devices); otherwise the heuristic's placement stands. Everything here is a pure function of an
:class:`~sharing.slots.Inventory` and requests; the solver is imported on first use, so importing
:mod:`sharing` stays dependency-free.

The layout-count models and their realisation on devices are in :mod:`sharing.mig_exact_layouts`, what both
models share (candidate devices, the MILP builder, the result type, the spread count) in
:mod:`sharing.mig_exact_model`; the public names are importable from here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharing.mig_exact_layouts import maximal_layouts, solve_aggregated
from sharing.mig_exact_model import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_DEVICES,
    Classes,
    Device,
    ExactResult,
    Milp,
    allowed_models,
    candidate_devices,
    checked_gpus_in_use,
    eligible_node_names,
    fits,
    group_classes,
    modelled,
    node_states,
    slice_mask,
    spread_violations,
)
from sharing.packer import Packer, batch_owner, charged_fraction, place_batch
from sharing.slots import AllocationError, Inventory, Slot, SlotRequest

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_MAX_DEVICES",
    "BatchOutcome",
    "ExactResult",
    "maximal_layouts",
    "place_batch_exact",
    "solve_aggregated",
    "solve_exact",
    "spread_violations",
]


def solve_exact(
    inv: Inventory,
    reqs: Sequence[SlotRequest],
    budget_s: float = DEFAULT_BUDGET_S,
    *,
    anti_affinity: bool = True,
    node_anti_affinity: bool = True,
    max_devices: int = DEFAULT_MAX_DEVICES,
    no_worse_than: tuple[int, int, int] | None = None,
    min_devices_used: int | None = None,
    prefer_open_nodes: bool = False,
    cuts: list[str] | None = None,
) -> ExactResult | None:
    """The MILP placement of ``reqs`` on ``inv`` as it is (``inv`` is not changed), or None when the instance is
    beyond the exact path (a request that is not a single MIG slot, more than ``max_devices`` candidate
    devices) or HiGHS found no solution within its node limit (``DEFAULT_NODE_LIMIT``, the work limit) or the
    wall-clock safety cut ``budget_s`` (model building included; when the cut fires a line goes to ``cuts``).

    ``no_worse_than`` (unplaced, spreads broken, devices used: a placement already in hand) and
    ``min_devices_used`` (a lower bound on the devices a full placement needs) only prune: the first cuts off
    solutions lexicographically worse than the one in hand, the second lets HiGHS stop as soon as it reaches
    the bound. Both leave the optimum as it is. ``prefer_open_nodes`` (the packer's option, on in the decision core:
    idle nodes stay whole and lendable) adds a tie-break among placements with the fewest devices: the fewest
    nodes with nothing on them opened."""
    t0 = time.perf_counter()
    if not reqs:
        return ExactResult((), True, "empty", 0.0, inv.gpus_in_use())
    if not all(modelled(r) for r in reqs):
        return None
    devs = candidate_devices(inv)
    if not devs or len(devs) > max_devices:
        return None
    # Replica classes: a request shape, per model for the models anti-affinity spreads.
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.model] = counts.get(r.model, 0) + 1
    total = {m: counts[m] + inv.model_allocation_count(m) for m in counts}
    spread = [m for m in counts if anti_affinity and total[m] >= 2]
    spread_set = set(spread)
    cl = group_classes(reqs, lambda r: (r.memory_gib, r.compute_fraction, tuple(sorted(r.kinds)),
                                        tuple(r.gpu_models), r.cpu_millis, r.host_memory_gib,
                                        r.model if r.model in spread_set else None))
    model = Milp()
    ev = _exact_variables(model, inv, devs, cl, spread, len(reqs), prefer_open_nodes)
    _device_rows(model, devs, ev, len(cl.first))
    _demand_rows(model, inv, devs, ev, cl, spread, total, node_anti_affinity)
    _host_rows(model, inv, devs, ev, cl)
    _pruning_rows(model, inv, devs, ev, no_worse_than, min_devices_used)
    # A gap below what separates one device from the tie-breaks (those sum below 0.65), on the largest objective
    # possible, proves the device count (and every count before it).
    obj_max = ev.w_unplaced * len(reqs) + ev.w_spread * len(spread) + len(devs) + 2
    if no_worse_than is not None and no_worse_than[0] == 0:
        obj_max = ev.w_spread * min(no_worse_than[1], len(spread)) + len(devs) + 2  # the cuts bound every incumbent
    left = budget_s - (time.perf_counter() - t0)
    if left <= 0:
        if cuts is not None:
            cuts.append("no time left to solve the per-device MILP")
        return None
    sol = model.solve(left, obj_max, cuts)
    if sol is None:
        return None
    slots = _read_placement(sol.x, devs, ev, cl, len(reqs))
    if slots is None:
        return None  # cannot happen for a feasible solution; the heuristic then stands
    used = checked_gpus_in_use(inv, reqs, slots)
    if used is None:
        return None  # the Inventory is the authority on legality: a slot it refuses sends us to the heuristic
    return ExactResult(tuple(slots), sol.optimal, sol.message, time.perf_counter() - t0, used)


@dataclass(frozen=True)
class _ExactVars:
    """The per-device MILP's variables (indices into the :class:`Milp`)."""

    u_of: dict[int, int]  # device -> used (devices that hold nothing yet only)
    n_of: dict[str, int]  # idle node -> opened (with prefer_open_nodes only)
    w_of: dict[tuple[int, int], int]  # (device, option index) -> the new instance is created
    a_of: dict[tuple[int, int, str], int]  # (class, device, profile) -> replicas on that profile there
    q_of: list[int]  # per class: replicas left unplaced
    v_of: dict[str, int]  # per spread model: its spread given up
    w_unplaced: float
    w_spread: float


def _exact_variables(m: Milp, inv: Inventory, devs: Sequence[Device], cl: Classes, spread: Sequence[str],
                     n_reqs: int, prefer_open_nodes: bool) -> _ExactVars:
    """Variables, in order: u[d] (empty devices), n[node], w[d,p,s], a[c,d,p], q[c], v[m]. The weights make the
    objective lexicographic: unplaced, then spreads given up, then devices, then tie-breaks below one device."""
    n_dev = len(devs)
    price_sum = sum(d.gpu.price_per_hour for d in devs) + 1.0
    w_spread = n_dev + 1.0  # a spread given up outweighs every device
    w_unplaced = w_spread * (len(spread) + 1) + n_dev + 1.0  # an unplaced replica outweighs everything else
    u_of: dict[int, int] = {}
    for di, d in enumerate(devs):
        if not d.fixed_used:
            u_of[di] = m.var(1.0 + 0.2 * d.gpu.price_per_hour / price_sum, 1)
    idle_nodes = sorted({d.key[0] for d in devs if not any(not e.idle for e in node_states(inv, d.key[0]))})
    n_of = {n: m.var(0.3 / (len(idle_nodes) + 1), 1) for n in idle_nodes} if prefer_open_nodes else {}
    n_w = sum(len(d.options) for d in devs) + 1
    w_of: dict[tuple[int, int], int] = {}
    for di, d in enumerate(devs):
        for oi in range(len(d.options)):
            w_of[(di, oi)] = m.var(0.05 / n_w, 1)  # an instance nobody uses is never created
    max_slot = max((d.gpu.price_per_hour for d in devs), default=1.0) or 1.0
    a_of: dict[tuple[int, int, str], int] = {}
    for ci, r in enumerate(cl.first):
        n_c = len(cl.members[cl.order[ci]])
        allowed = allowed_models(inv, r)
        for di, d in enumerate(devs):
            if allowed is not None and d.gpu.name not in allowed:
                continue
            for p in d.gpu.profiles_by_size():
                if not fits(d.gpu, p, r):
                    continue
                if not any(q is p for q, _ in d.options) and not any(k == p.key for k, _ in d.free_pinned):
                    continue
                frac = charged_fraction(Slot.mig(d.key[0], d.key[1], d.gpu, p.key, p.placements[0]), d.gpu)
                tie = 0.1 * frac * d.gpu.price_per_hour / (max_slot * (n_reqs + 1))
                a_of[(ci, di, p.key)] = m.var(tie, n_c)
    q_of = [m.var(w_unplaced, len(cl.members[k])) for k in cl.order]
    v_of = {s: m.var(w_spread, 1) for s in spread}
    return _ExactVars(u_of, n_of, w_of, a_of, q_of, v_of, w_unplaced, w_spread)


def _device_rows(m: Milp, devs: Sequence[Device], ev: _ExactVars, n_classes: int) -> None:
    """What one device can hold: its memory and compute slices, each profile's count, the instances used."""
    w_of, a_of, u_of = ev.w_of, ev.a_of, ev.u_of
    for di, d in enumerate(devs):
        st, gpu = d.state, d.gpu
        occ = st.occupied_mask
        # Memory slices: at most one instance each, and none on an unused device.
        for j in range(gpu.mem_slices_total):
            cover = [(w_of[(di, oi)], 1.0) for oi, (p, s) in enumerate(d.options)
                     if slice_mask(s, p.mem_slices) >> j & 1]
            if not cover:
                continue
            if di in u_of:
                m.row([*cover, (u_of[di], -1.0)], -math.inf, 0.0)
            else:
                m.row(cover, -math.inf, 0.0 if occ >> j & 1 else 1.0)
        # Compute slices and profile counts.
        comp = [(w_of[(di, oi)], float(p.compute_slices)) for oi, (p, _) in enumerate(d.options)]
        if comp:
            m.row(comp, -math.inf, float(gpu.compute_slices_total - st.mig_compute_used))
        for p in gpu.profiles_by_size():
            mine = [(w_of[(di, oi)], 1.0) for oi, (q, _) in enumerate(d.options) if q is p]
            if mine:
                m.row(mine, -math.inf, float(p.max_count - st.profile_count(p.key)))
            # Replicas on profile p: its new instances plus its free pinned ones.
            users = [(a_of[(ci, di, p.key)], 1.0) for ci in range(n_classes) if (ci, di, p.key) in a_of]
            if users:
                pinned = sum(1 for k, _ in d.free_pinned if k == p.key)
                m.row([*users, *((j, -1.0) for j, _ in mine)], -math.inf, float(pinned))
                if pinned and di in u_of:  # a pinned instance used opens its device too
                    m.row([*users, (u_of[di], -float(pinned + len(mine)))], -math.inf, 0.0)


def _demand_rows(m: Milp, inv: Inventory, devs: Sequence[Device], ev: _ExactVars, cl: Classes,
                 spread: Sequence[str], total: Mapping[str, int], node_anti_affinity: bool) -> None:
    """Every replica placed or counted unplaced; anti-affinity; a device opened opens its idle node."""
    a_of = ev.a_of
    for ci, k in enumerate(cl.order):
        mine = [(j, 1.0) for (c, _, _), j in a_of.items() if c == ci]
        m.row([*mine, (ev.q_of[ci], 1.0)], float(len(cl.members[k])), float(len(cl.members[k])))
    # Anti-affinity: not all of a model's replicas in one node (several eligible nodes) or one device.
    for s in spread:
        mine_c = {ci for ci, k in enumerate(cl.order) if k[-1] == s}
        here = inv.model_device_counts(s)
        eligible = eligible_node_names(inv, cl.first[next(iter(mine_c))])
        if node_anti_affinity and len(eligible) > 1:
            groups: dict[object, set[int]] = {}
            for di, d in enumerate(devs):
                groups.setdefault(d.key[0], set()).add(di)
            held = {n: sum(c for (node, _), c in here.items() if node == n) for n in groups}
        else:
            groups = {d.key: {di} for di, d in enumerate(devs)}
            held = {d.key: here.get(d.key, 0) for d in devs}
        for g, members in groups.items():
            es = [(j, 1.0) for (c, di, _), j in a_of.items() if c in mine_c and di in members]
            if es:
                m.row([*es, (ev.v_of[s], -float(total[s]))], -math.inf, float(total[s] - 1 - held[g]))
    for di, d in enumerate(devs):
        if d.key[0] in ev.n_of and di in ev.u_of:
            m.row([(ev.u_of[di], 1.0), (ev.n_of[d.key[0]], -1.0)], -math.inf, 0.0)


def _host_rows(m: Milp, inv: Inventory, devs: Sequence[Device], ev: _ExactVars, cl: Classes) -> None:
    """A node's host CPU and memory (where it declares them): the pods placed there ask at most what is free."""
    if not inv.host_accounted or not any(r.asks_host for r in cl.first):
        return
    by_node: dict[str, set[int]] = {}
    for di, d in enumerate(devs):
        by_node.setdefault(d.key[0], set()).add(di)
    for node, members in by_node.items():
        free = inv.host_free(node)
        for i, need in enumerate((lambda r: float(r.cpu_millis), lambda r: r.host_memory_gib)):
            if math.isinf(free[i]):
                continue
            es = [(j, need(cl.first[c])) for (c, di, _), j in ev.a_of.items()
                  if di in members and need(cl.first[c]) > 0]
            if es:
                m.row(es, -math.inf, max(0.0, free[i]) + 1e-9)


def _pruning_rows(m: Milp, inv: Inventory, devs: Sequence[Device], ev: _ExactVars,
                  no_worse_than: tuple[int, int, int] | None, min_devices_used: int | None) -> None:
    """Cuts that leave the optimum as it is: no worse than a placement in hand, a known floor on the devices,
    interchangeable empty devices of one node opened in order (symmetry breaking, which keeps the solve fast)."""
    used_now = sum(1 for d in devs if d.fixed_used)
    u_all = [(j, 1.0) for j in ev.u_of.values()]
    if no_worse_than is not None:
        # Lexicographic, as the objective: a count may only be capped once every count before it is at zero in
        # the placement in hand (fewer unplaced replicas may need more devices, and are still better).
        hq, hv, hd = no_worse_than
        m.row([(j, 1.0) for j in ev.q_of], -math.inf, float(hq))
        if ev.v_of and hq == 0:
            m.row([(j, 1.0) for j in ev.v_of.values()], -math.inf, float(hv))
        outside = inv.gpus_in_use() - used_now  # devices in use that are no candidates (held whole, MIG off)
        if u_all and hq == 0 and hv == 0:
            m.row(u_all, -math.inf, float(hd - outside - used_now))
    if min_devices_used is not None and u_all:
        # Valid for placements that place everything, the only ones that can be optimal when one exists.
        m.row(u_all, float(min_devices_used - inv.gpus_in_use()), math.inf)
    prev: dict[tuple, int] = {}
    for di, d in enumerate(devs):
        if di not in ev.u_of or d.state.pinned:
            continue
        sig = (d.key[0], d.state.signature)
        if sig in prev:
            m.row([(ev.u_of[di], 1.0), (ev.u_of[prev[sig]], -1.0)], -math.inf, 0.0)
        prev[sig] = di


def _read_placement(x: object, devs: Sequence[Device], ev: _ExactVars, cl: Classes,
                    n_reqs: int) -> list[Slot | None] | None:
    """One slot per request off the solution: per device and profile, the new starts chosen, then the free
    pinned ones (None if the counts do not match, which a feasible solution never does)."""
    queues = {ci: list(cl.members[k]) for ci, k in enumerate(cl.order)}
    slots: list[Slot | None] = [None] * n_reqs
    for di, d in enumerate(devs):
        for p in d.gpu.profiles_by_size():
            starts = [s for oi, (q, s) in enumerate(d.options) if q is p and x[ev.w_of[(di, oi)]] > 0]  # type: ignore[index]
            starts += [s for k, s in d.free_pinned if k == p.key]
            for ci in range(len(cl.first)):
                j = ev.a_of.get((ci, di, p.key))
                for _ in range(int(x[j]) if j is not None else 0):  # type: ignore[index]
                    if not starts or not queues[ci]:
                        return None
                    slots[queues[ci].pop(0)] = Slot.mig(d.key[0], d.key[1], d.gpu, p.key, starts.pop(0))
    return slots


@dataclass(frozen=True)
class BatchOutcome:
    """Which placement :func:`place_batch_exact` kept, and the figures it compared."""

    used: str  # "exact" or "heuristic"
    exact: ExactResult | None
    exact_seconds: float  # the whole exact attempt (both models when the per-device one is not tried)
    heuristic_key: tuple[int, int, int]  # (unplaced, spreads broken, devices used)
    exact_key: tuple[int, int, int] | None
    # Where the wall-clock safety cut fired (empty: every solve ended on its own or on its node limit, so the
    # placement is the instance's alone)
    cuts: tuple[str, ...] = ()

    @property
    def budget_exceeded(self) -> bool:
        """Whether the safety cut fired: this placement may differ on a faster or less loaded machine."""
        return bool(self.cuts)


def _key(inv: Inventory, slots: Sequence[Slot | None], models: Mapping[str, SlotRequest],
         node_level: bool) -> tuple[int, int, int]:
    return (sum(s is None for s in slots), spread_violations(inv, models, node_level), inv.gpus_in_use())


def place_batch_exact(
    packer: Packer,
    inv: Inventory,
    reqs: Sequence[SlotRequest],
    budget_s: float = DEFAULT_BUDGET_S,
    owners: Sequence[str] | None = None,
    *,
    decreasing: bool = True,
    max_devices: int = DEFAULT_MAX_DEVICES,
    outcome: list[BatchOutcome] | None = None,
) -> list[Slot | None]:
    """:func:`~sharing.packer.place_batch`, but the MILP's placement when it is no worse than ``packer``'s.

    Places and allocates ``reqs`` on ``inv`` (existing allocations are kept as they are) and returns one slot per
    request (None: not placed), like ``place_batch``. The heuristic (``packer`` through ``place_batch``, largest
    first by default) runs on a copy; :func:`solve_exact` (or, beyond ``max_devices``, :func:`solve_aggregated`)
    runs within its node limit, all of it cut short at ``budget_s`` of wall clock (the safety cut, which
    ``outcome`` reports as ``budget_exceeded``; the two layout-count solves on a small cluster get half of what is
    left each); the exact placement is taken only if it is no worse than the
    heuristic's in the order (unplaced replicas, spreads broken, devices used): never more devices unless it places
    more replicas or keeps more spreads. The packer's ``anti_affinity``, ``node_anti_affinity`` and
    ``prefer_open_nodes`` settings are the MILP's. ``outcome``, when given, receives a :class:`BatchOutcome` (for
    benchmarks and logs).
    """
    aa = bool(getattr(packer, "anti_affinity", True))
    node_aa = bool(getattr(packer, "node_anti_affinity", True))
    open_nodes = bool(getattr(packer, "prefer_open_nodes", False))
    models = {r.model: r for r in reversed(reqs)}  # each model's first request
    heur_inv = inv.copy()
    heur = place_batch(packer, heur_inv, reqs, owners, decreasing=decreasing)
    hkey = _key(heur_inv, heur, models, node_aa)
    exact = None
    ekey = None
    secs = 0.0
    cuts: list[str] = []  # where the wall-clock safety cut fired (the work limit did not bound the solve)
    # Nothing to gain when the heuristic already placed everything on no new device.
    if hkey[0] or hkey[1] or hkey[2] > inv.gpus_in_use():
        t0 = time.perf_counter()
        floor = None
        # The layout-count models know no node's CPU/memory: only the per-device MILP does (its host rows).
        host_bound = inv.host_accounted and any(r.asks_host for r in reqs)
        if len(candidate_devices(inv)) <= max_devices and not host_bound:
            # The layout-count model per node, exact for anti-affinity too (idle clusters only; mostly well under
            # a second here): realised with every spread kept, it is optimal as it stands; else its optimum is a
            # floor that lets the per-device solve stop as soon as it reaches it.
            # First the model per kind (fastest; a floor for both others), then per node, each taken as it
            # stands when realised with every spread kept.
            for per_node in (False, True) if aa else (False,):
                left = budget_s - (time.perf_counter() - t0)
                lb = solve_aggregated(inv, reqs, left / 2, anti_affinity=aa, node_anti_affinity=node_aa,
                                      prefer_open_nodes=open_nodes, per_node=per_node, min_devices_used=floor,
                                      cuts=cuts)
                if lb is None or not lb.optimal or not all(sl is not None for sl in lb.slots):
                    break
                floor = lb.devices_used
                trial = inv.copy()
                _allocate(trial, reqs, lb.slots, owners)
                if not aa or spread_violations(trial, models, node_aa) == 0:
                    exact = lb
                    break
        if exact is None:
            exact = solve_exact(inv, reqs, budget_s - (time.perf_counter() - t0), anti_affinity=aa,
                                node_anti_affinity=node_aa, max_devices=max_devices, no_worse_than=hkey,
                                prefer_open_nodes=open_nodes,
                                min_devices_used=floor, cuts=cuts)
        left = budget_s - (time.perf_counter() - t0)
        if exact is None and len(candidate_devices(inv)) > max_devices and not host_bound:
            if left > 0:
                exact = solve_aggregated(inv, reqs, left, anti_affinity=aa, node_anti_affinity=node_aa,
                                         prefer_open_nodes=open_nodes, cuts=cuts)
            else:
                cuts.append("no time left to solve the layout-count MILP")
        secs = time.perf_counter() - t0
    chosen = heur
    if exact is not None:
        # The MILPs lay out GPU slices only: each slot gets its pod's host requests here, and a placement whose
        # node lacks the CPU/memory for them (where the node accounts host capacity) is not taken.
        ex_slots = [None if sl is None else sl.with_host(r.cpu_millis, r.host_memory_gib)
                    for r, sl in zip(reqs, exact.slots, strict=True)]
        ex_inv = inv.copy()
        try:
            _allocate(ex_inv, reqs, ex_slots, owners)
        except AllocationError:
            ex_slots = None
        if ex_slots is not None:
            ekey = _key(ex_inv, ex_slots, models, node_aa)
            if ekey <= hkey:  # lexicographic: fewer unplaced first, then fewer spreads broken, then fewer devices
                chosen = ex_slots
    if chosen is heur:
        place_batch(packer, inv, reqs, owners, decreasing=decreasing)
    else:
        _allocate(inv, reqs, chosen, owners)
    if outcome is not None:
        outcome.append(BatchOutcome("heuristic" if chosen is heur else "exact", exact, secs, hkey, ekey,
                                    tuple(cuts)))
    return chosen


def _allocate(inv: Inventory, reqs: Sequence[SlotRequest], slots: Sequence[Slot | None],
              owners: Sequence[str] | None) -> None:
    """Allocate as :func:`~sharing.packer.place_batch` names owners (``<model>/<i>``, suffixed on a clash)."""
    used = {o for o, _ in inv.allocations()}
    for i, (r, s) in enumerate(zip(reqs, slots, strict=True)):
        if s is None:
            continue
        owner = owners[i] if owners is not None else batch_owner(r, i, used)
        inv.allocate(s, owner, model=r.model)
