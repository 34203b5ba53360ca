"""Exact placement of a batch of MIG replicas on a small cluster: a per-device MILP, the heuristic as fallback.

The greedy :class:`~sharing.packer.CostAwarePacker` places one replica at a time, so on a handful of GPUs it
often opens one GPU more than needed (one GPU is +11-20% there). For instances of up to ``max_devices``
candidate GPUs the placement of a whole batch is instead read off a MILP solved by HiGHS
(``scipy.optimize.milp``) within a time budget. Per candidate device ``d`` (MIG on, not held whole):

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

The exact placement is returned only when HiGHS finds a solution in the budget and that solution is no worse
than the heuristic's on every count (unplaced, spreads given up, devices); otherwise the heuristic's placement
stands. Everything here is a pure function of an :class:`~sharing.slots.Inventory` and requests; the solver
is imported on first use, so importing :mod:`sharing` stays dependency-free.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharing.catalog import GpuModel, MigProfile
from sharing.packer import Packer, charged_fraction, place_batch
from sharing.slots import AllocationError, DeviceState, Inventory, Slot, SlotRequest

DEFAULT_BUDGET_S = 2.0
DEFAULT_MAX_DEVICES = 16  # "small" instances: candidate MIG GPUs the MILP is tried on


@dataclass(frozen=True)
class ExactResult:
    """The MILP's answer: one slot (or None: left unplaced) per request, and what HiGHS said."""

    slots: tuple[Slot | None, ...]
    optimal: bool  # HiGHS proved the device count optimal (within its gap) in the budget
    status: str
    seconds: float
    devices_used: int  # devices holding something after the placement (existing ones included)


@dataclass(frozen=True)
class _Device:
    key: tuple[str, int]
    state: DeviceState
    gpu: GpuModel
    options: tuple[tuple[MigProfile, int], ...]  # new instances that can be created on it now
    free_pinned: tuple[tuple[str, int], ...]  # existing instances with no occupant
    fixed_used: bool  # already holds something


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def _modelled(req: SlotRequest) -> bool:
    return "mig" in req.kinds and not req.whole_only and req.memory_gib is not None and req.gpus == 1


def _fits(gpu: GpuModel, p: MigProfile, req: SlotRequest) -> bool:
    return p.memory_gib >= (req.memory_gib or math.inf) and gpu.compute_fraction(p) >= req.compute_fraction


def _allowed(inv: Inventory, req: SlotRequest) -> set[str] | None:
    return {inv.catalog.resolve(m) for m in req.gpu_models if m in inv.catalog} if req.gpu_models else None


def _devices(inv: Inventory) -> list[_Device]:
    out = []
    for key, d in inv.devices.items():
        if not d.mig_enabled or not d.gpu.mig_capable or d.whole_owner is not None:
            continue
        opts = tuple((p, s) for p in d.gpu.profiles_by_size() for s in p.placements if d.can_create(p, s))
        free = tuple(inst for inst in d.pinned if inst not in d.usage)
        out.append(_Device(key, d, d.gpu, opts, free, bool(d.entries)))
    return out


def spread_violations(inv: Inventory, requests: Mapping[str, SlotRequest], node_level: bool = True) -> int:
    """Models (of ``requests``: model -> its request) with >= 2 replicas that break the packer's spread: all on
    one node when several nodes could hold the model, else all on one device (the rule the MILP keeps)."""
    by_model = inv.allocations_by_model()
    bad = 0
    for m, req in requests.items():
        reps = by_model.get(m, [])
        if len(reps) < 2:
            continue
        nodes = {s.node for _, s in reps}
        devs = {(s.node, i) for _, s in reps for i in s.devices}
        eligible = _eligible_node_names(inv, req)
        if node_level and len(eligible) > 1:
            bad += len(nodes) < 2
        else:
            bad += len(devs) < 2
    return bad


def _eligible_node_names(inv: Inventory, req: SlotRequest) -> set[str]:
    """Nodes with a MIG GPU some profile of which holds ``req`` (the bound's notion of where a model can go)."""
    allowed = _allowed(inv, req)
    out = set()
    for n in inv.nodes.values():
        if not n.gpu_count or not n.mig_enabled or (allowed is not None and n.gpu_model not in allowed):
            continue
        gpu = inv.catalog.get(n.gpu_model)
        if gpu.mig_capable and any(_fits(gpu, p, req) for p in gpu.profiles_by_size()):
            out.add(n.name)
    return out


def solve_exact(
    inv: Inventory,
    reqs: Sequence[SlotRequest],
    budget_s: float = DEFAULT_BUDGET_S,
    *,
    anti_affinity: bool = True,
    node_anti_affinity: bool = True,
    max_devices: int = DEFAULT_MAX_DEVICES,
) -> ExactResult | None:
    """The MILP placement of ``reqs`` on ``inv`` as it is (``inv`` is not changed), or None when the instance is
    beyond the exact path (a request that is not a single MIG slot, more than ``max_devices`` candidate
    devices) or HiGHS found no solution within ``budget_s`` seconds (model building included)."""
    t0 = time.perf_counter()
    if not reqs:
        return ExactResult((), True, "empty", 0.0, inv.gpus_in_use())
    if not all(_modelled(r) for r in reqs):
        return None
    devs = _devices(inv)
    if not devs or len(devs) > max_devices:
        return None
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    # Replica classes: a request shape, per model for the models anti-affinity spreads.
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.model] = counts.get(r.model, 0) + 1
    existing = {m: inv.model_allocation_count(m) for m in counts}
    total = {m: counts[m] + existing[m] for m in counts}
    spread = [m for m in counts if anti_affinity and total[m] >= 2]
    spread_set = set(spread)

    def class_key(r: SlotRequest) -> tuple:
        return (r.memory_gib, r.compute_fraction, tuple(sorted(r.kinds)), tuple(r.gpu_models),
                r.model if r.model in spread_set else None)

    classes: dict[tuple, list[int]] = {}
    for i, r in enumerate(reqs):
        classes.setdefault(class_key(r), []).append(i)
    class_list = list(classes)
    creq = [reqs[classes[k][0]] for k in class_list]
    callowed = [_allowed(inv, r) for r in creq]

    # Variables, in order: u[d] (empty devices), w[d,p,s], a[c,d,p], q[c], v[m].
    cost: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    integ: list[int] = []

    def var(c: float, upper: float) -> int:
        cost.append(c)
        lo.append(0.0)
        hi.append(upper)
        integ.append(1)
        return len(cost) - 1

    n_dev = len(devs)
    price_sum = sum(d.gpu.price_per_hour for d in devs) + 1.0
    w_spread = n_dev + 1.0  # a spread given up outweighs every device
    w_unplaced = w_spread * (len(spread) + 1) + n_dev + 1.0  # an unplaced replica outweighs everything else
    u_of: dict[int, int] = {}
    for di, d in enumerate(devs):
        if not d.fixed_used:
            u_of[di] = var(1.0 + 0.25 * d.gpu.price_per_hour / price_sum, 1)
    n_w = sum(len(d.options) for d in devs) + 1
    w_of: dict[tuple[int, int], int] = {}  # (device, option index) -> var
    for di, d in enumerate(devs):
        for oi in range(len(d.options)):
            w_of[(di, oi)] = var(0.05 / n_w, 1)  # an instance nobody uses is never created
    max_slot = max((d.gpu.price_per_hour for d in devs), default=1.0) or 1.0
    a_of: dict[tuple[int, int, str], int] = {}
    for ci, r in enumerate(creq):
        n_c = len(classes[class_list[ci]])
        for di, d in enumerate(devs):
            if callowed[ci] is not None and d.gpu.name not in callowed[ci]:
                continue
            for p in d.gpu.profiles_by_size():
                if not _fits(d.gpu, p, r):
                    continue
                if not any(q is p for q, _ in d.options) and not any(k == p.key for k, _ in d.free_pinned):
                    continue
                frac = charged_fraction(Slot.mig(d.key[0], d.key[1], d.gpu, p.key, p.placements[0]), d.gpu)
                tie = 0.1 * frac * d.gpu.price_per_hour / (max_slot * (len(reqs) + 1))
                a_of[(ci, di, p.key)] = var(tie, n_c)
    q_of = [var(w_unplaced, len(classes[k])) for k in class_list]
    v_of = {m: var(w_spread, 1) for m in spread}

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rlo: list[float] = []
    rhi: list[float] = []

    def row(entries: Sequence[tuple[int, float]], low: float, high: float) -> None:
        r = len(rlo)
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        rlo.append(low)
        rhi.append(high)

    for di, d in enumerate(devs):
        st, gpu = d.state, d.gpu
        occ = st.occupied_mask
        # Memory slices: at most one instance each, and none on an unused device.
        for j in range(gpu.mem_slices_total):
            cover = [(w_of[(di, oi)], 1.0) for oi, (p, s) in enumerate(d.options) if _mask(s, p.mem_slices) >> j & 1]
            if not cover:
                continue
            if di in u_of:
                row([*cover, (u_of[di], -1.0)], -math.inf, 0.0)
            else:
                row(cover, -math.inf, 0.0 if occ >> j & 1 else 1.0)
        # Compute slices and profile counts.
        comp = [(w_of[(di, oi)], float(p.compute_slices)) for oi, (p, _) in enumerate(d.options)]
        if comp:
            row(comp, -math.inf, float(gpu.compute_slices_total - st.mig_compute_used))
        for p in gpu.profiles_by_size():
            mine = [(w_of[(di, oi)], 1.0) for oi, (q, _) in enumerate(d.options) if q is p]
            if mine:
                row(mine, -math.inf, float(p.max_count - st.profile_count(p.key)))
            # Replicas on profile p: its new instances plus its free pinned ones.
            users = [(a_of[(ci, di, p.key)], 1.0) for ci in range(len(creq)) if (ci, di, p.key) in a_of]
            if users:
                pinned = sum(1 for k, _ in d.free_pinned if k == p.key)
                row([*users, *((j, -1.0) for j, _ in mine)], -math.inf, float(pinned))
                if pinned and di in u_of:  # a pinned instance used opens its device too
                    row([*users, (u_of[di], -float(pinned + len(mine)))], -math.inf, 0.0)
    # Every replica placed or counted unplaced.
    for ci, k in enumerate(class_list):
        mine = [(j, 1.0) for (c, _, _), j in a_of.items() if c == ci]
        row([*mine, (q_of[ci], 1.0)], float(len(classes[k])), float(len(classes[k])))
    # Anti-affinity: not all of a model's replicas in one node (several eligible nodes) or one device.
    for m in spread:
        mine_c = {ci for ci, k in enumerate(class_list) if k[-1] == m}
        here = inv.model_device_counts(m)
        eligible = _eligible_node_names(inv, creq[next(iter(mine_c))])
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
                row([*es, (v_of[m], -float(total[m]))], -math.inf, float(total[m] - 1 - held[g]))
    # Symmetry: interchangeable empty devices of one node are opened in order.
    prev: dict[tuple, int] = {}
    for di, d in enumerate(devs):
        if di not in u_of or d.state.pinned:
            continue
        sig = (d.key[0], d.state.signature)
        if sig in prev:
            row([(u_of[di], 1.0), (u_of[prev[sig]], -1.0)], -math.inf, 0.0)
        prev[sig] = di

    nv = len(cost)
    left = budget_s - (time.perf_counter() - t0)
    if left <= 0:
        return None
    A = coo_matrix((vals, (rows, cols)), shape=(len(rlo), nv)).tocsr()
    # A gap below one device on the objective (devices dominate the tie-breaks) proves the device count.
    res = milp(
        np.array(cost),
        constraints=LinearConstraint(A, np.array(rlo), np.array(rhi)),
        integrality=np.array(integ),
        bounds=Bounds(np.array(lo), np.array(hi)),
        options={"time_limit": max(left, 1e-3), "disp": False, "mip_rel_gap": 0.5 / (n_dev + 2)},
    )
    if res.x is None:
        return None
    x = np.round(res.x).astype(int)
    # Read the placement off: per device and profile, the new starts chosen then the free pinned ones.
    queues = {ci: list(classes[k]) for ci, k in enumerate(class_list)}
    slots: list[Slot | None] = [None] * len(reqs)
    for di, d in enumerate(devs):
        for p in d.gpu.profiles_by_size():
            starts = [s for oi, (q, s) in enumerate(d.options) if q is p and x[w_of[(di, oi)]] > 0]
            starts += [s for k, s in d.free_pinned if k == p.key]
            for ci in range(len(creq)):
                j = a_of.get((ci, di, p.key))
                for _ in range(int(x[j]) if j is not None else 0):
                    if not starts or not queues[ci]:
                        return None  # cannot happen for a feasible solution; the heuristic then stands
                    slots[queues[ci].pop(0)] = Slot.mig(d.key[0], d.key[1], d.gpu, p.key, starts.pop(0))
    trial = inv.copy()
    try:
        for r, s in zip(reqs, slots, strict=True):
            if s is not None:
                trial.allocate(s, _fresh_owner(trial, r.model), model=r.model)
    except AllocationError:
        return None  # the Inventory is the authority on legality: a slot it refuses sends us to the heuristic
    return ExactResult(tuple(slots), res.status == 0, str(res.message), time.perf_counter() - t0,
                       trial.gpus_in_use())


def _fresh_owner(inv: Inventory, model: str) -> str:
    n = inv.model_allocation_count(model)
    owners = {o for o, _ in inv.allocations()}
    while f"{model}/x{n}" in owners:
        n += 1
    return f"{model}/x{n}"


@dataclass(frozen=True)
class BatchOutcome:
    """Which placement :func:`place_batch_exact` kept, and the figures it compared."""

    used: str  # "exact" or "heuristic"
    exact: ExactResult | None
    heuristic_key: tuple[int, int, int]  # (unplaced, spreads broken, devices used)
    exact_key: tuple[int, int, int] | None


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
    first by default) runs on a copy; :func:`solve_exact` runs within ``budget_s``; the exact placement is taken
    only if it leaves no more replicas unplaced, breaks no more spreads and uses no more devices than the
    heuristic's. The packer's ``anti_affinity`` / ``node_anti_affinity`` settings are the MILP's. ``outcome``,
    when given, receives a :class:`BatchOutcome` (for benchmarks and logs).
    """
    aa = bool(getattr(packer, "anti_affinity", True))
    node_aa = bool(getattr(packer, "node_anti_affinity", True))
    models = {r.model: r for r in reversed(reqs)}  # each model's first request
    heur_inv = inv.copy()
    heur = place_batch(packer, heur_inv, reqs, owners, decreasing=decreasing)
    hkey = _key(heur_inv, heur, models, node_aa)
    exact = None
    ekey = None
    # Nothing to gain when the heuristic already placed everything on no new device.
    if hkey[0] or hkey[1] or hkey[2] > inv.gpus_in_use():
        exact = solve_exact(inv, reqs, budget_s, anti_affinity=aa, node_anti_affinity=node_aa,
                            max_devices=max_devices)
    chosen = heur
    if exact is not None:
        ex_inv = inv.copy()
        _allocate(ex_inv, reqs, exact.slots, owners)
        ekey = _key(ex_inv, exact.slots, models, node_aa)
        if all(e <= h for e, h in zip(ekey, hkey, strict=True)):
            chosen = list(exact.slots)
    if chosen is heur:
        place_batch(packer, inv, reqs, owners, decreasing=decreasing)
    else:
        _allocate(inv, reqs, chosen, owners)
    if outcome is not None:
        outcome.append(BatchOutcome("heuristic" if chosen is heur else "exact", exact, hkey, ekey))
    return chosen


def _allocate(inv: Inventory, reqs: Sequence[SlotRequest], slots: Sequence[Slot | None],
              owners: Sequence[str] | None) -> None:
    """Allocate as :func:`~sharing.packer.place_batch` names owners (``<model>/<i>``, suffixed on a clash)."""
    used = {o for o, _ in inv.allocations()}
    for i, (r, s) in enumerate(zip(reqs, slots, strict=True)):
        if s is None:
            continue
        if owners is not None:
            owner = owners[i]
        else:
            owner = base = f"{r.model}/{i}"
            n = 0
            while owner in used:
                n += 1
                owner = f"{base}.{n}"
            used.add(owner)
        inv.allocate(s, owner, model=r.model)
