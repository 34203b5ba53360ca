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

On a small cluster whose candidate GPUs are all idle (a batch planned from scratch), two layout-count models
come first (:func:`solve_aggregated`: how many GPUs run each maximal layout, per GPU kind, then per node, the
latter exact with anti-affinity); each is realised on devices and taken as it stands when it keeps every spread
(it then meets a lower bound), else its optimum is a floor for the next, which lets HiGHS stop on reaching it.

Beyond ``max_devices`` candidate GPUs, on a cluster whose candidate GPUs are all idle (a batch planned from
scratch), :func:`solve_aggregated` solves the layout-count model instead (how many GPUs of each kind run each
maximal layout; the model of the mig-bench's bound, whose size does not grow with the cluster) and realises it
on devices, spreading each model's replicas over nodes and devices.

The exact placement is used only when HiGHS finds a solution in the budget and that solution is no worse
than the heuristic's, compared as the objective ranks (fewer unplaced replicas, then fewer spreads broken,
then fewer devices); otherwise the heuristic's placement stands. Everything here is a pure function of an
:class:`~sharing.slots.Inventory` and requests; the solver is imported on first use, so importing
:mod:`sharing` stays dependency-free.
"""

from __future__ import annotations

import itertools
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


def _solver_limit(left_s: float) -> float:
    """HiGHS's time limit out of what is left of the budget: it overruns its limit a little, and reading the
    placement off and checking it with the Inventory takes the rest."""
    return max(0.9 * left_s - 0.02, 1e-3)


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
    no_worse_than: tuple[int, int, int] | None = None,
    min_devices_used: int | None = None,
    prefer_open_nodes: bool = False,
) -> ExactResult | None:
    """The MILP placement of ``reqs`` on ``inv`` as it is (``inv`` is not changed), or None when the instance is
    beyond the exact path (a request that is not a single MIG slot, more than ``max_devices`` candidate
    devices) or HiGHS found no solution within ``budget_s`` seconds (model building included).

    ``no_worse_than`` (unplaced, spreads broken, devices used: a placement already in hand) and
    ``min_devices_used`` (a lower bound on the devices a full placement needs) only prune: the first cuts off
    solutions lexicographically worse than the one in hand, the second lets HiGHS stop as soon as it reaches
    the bound. Both leave the optimum as it is. ``prefer_open_nodes`` (the packer's option, on in the decision core:
    idle nodes stay whole and lendable) adds a tie-break among placements with the fewest devices: the fewest
    nodes with nothing on them opened."""
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
    # A canonical order (largest first), so the model, and HiGHS's path through it, do not depend on the order
    # the requests came in.
    class_list = sorted(classes, key=lambda k: (-(reqs[classes[k][0]].memory_gib or 0.0), repr(k)))
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
            u_of[di] = var(1.0 + 0.2 * d.gpu.price_per_hour / price_sum, 1)
    idle_nodes = sorted({d.key[0] for d in devs if not any(not e.idle for e in _node_states(inv, d.key[0]))})
    n_of = {n: var(0.3 / (len(idle_nodes) + 1), 1) for n in idle_nodes} if prefer_open_nodes else {}
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
    for di, d in enumerate(devs):
        if d.key[0] in n_of and di in u_of:
            row([(u_of[di], 1.0), (n_of[d.key[0]], -1.0)], -math.inf, 0.0)
    used_now = sum(1 for d in devs if d.fixed_used)
    u_all = [(j, 1.0) for j in u_of.values()]
    if no_worse_than is not None:
        # Lexicographic, as the objective: a count may only be capped once every count before it is at zero in
        # the placement in hand (fewer unplaced replicas may need more devices, and are still better).
        hq, hv, hd = no_worse_than
        row([(j, 1.0) for j in q_of], -math.inf, float(hq))
        if v_of and hq == 0:
            row([(j, 1.0) for j in v_of.values()], -math.inf, float(hv))
        outside = inv.gpus_in_use() - used_now  # devices in use that are no candidates (held whole, MIG off)
        if u_all and hq == 0 and hv == 0:
            row(u_all, -math.inf, float(hd - outside - used_now))
    if min_devices_used is not None and u_all:
        # Valid for placements that place everything, the only ones that can be optimal when one exists.
        row(u_all, float(min_devices_used - inv.gpus_in_use()), math.inf)
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
    # A gap below what separates one device from the tie-breaks (those sum below 0.65), on the largest objective
    # possible, proves the device count (and every count before it).
    obj_max = w_unplaced * len(reqs) + w_spread * len(spread) + n_dev + 2
    if no_worse_than is not None and no_worse_than[0] == 0:
        obj_max = w_spread * min(no_worse_than[1], len(spread)) + n_dev + 2  # the cuts above bound every incumbent
    left = budget_s - (time.perf_counter() - t0)
    if left <= 0:
        return None
    A = coo_matrix((vals, (rows, cols)), shape=(len(rlo), nv)).tocsr()
    res = milp(
        np.array(cost),
        constraints=LinearConstraint(A, np.array(rlo), np.array(rhi)),
        integrality=np.array(integ),
        bounds=Bounds(np.array(lo), np.array(hi)),
        options={"time_limit": _solver_limit(left), "disp": False, "mip_rel_gap": 0.25 / obj_max},
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


_LAYOUTS: dict[str, tuple[tuple[tuple[str, int], ...], ...]] = {}


def maximal_layouts(gpu: GpuModel) -> tuple[tuple[tuple[str, int], ...], ...]:
    """One concrete set of instances ``(profile key, start)`` per maximal MIG layout of ``gpu`` (profile counts
    to which no instance can be added anywhere; non-maximal ones are dominated: an unused instance costs
    nothing). The same layouts the mig-bench's aggregated bound counts, with starts attached."""
    hit = _LAYOUTS.get(gpu.name)
    if hit is not None:
        return hit
    total = gpu.mem_slices_total
    options = [(p, st) for p in gpu.profiles_by_size() for st in p.placements if st + p.mem_slices <= total]
    found: dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = {}

    def can_add(mask: int, compute: int, counts: dict[str, int], p: MigProfile, st: int) -> bool:
        return (not mask & _mask(st, p.mem_slices) and counts.get(p.key, 0) < p.max_count
                and compute + p.compute_slices <= gpu.compute_slices_total)

    def dfs(i: int, mask: int, compute: int, counts: dict[str, int], chosen: list[tuple[str, int]]) -> None:
        if i == len(options):
            if not any(can_add(mask, compute, counts, p, st) for p, st in options):
                found.setdefault(tuple(sorted(counts.items())), tuple(chosen))
            return
        p, st = options[i]
        if can_add(mask, compute, counts, p, st):
            counts[p.key] = counts.get(p.key, 0) + 1
            chosen.append((p.key, st))
            dfs(i + 1, mask | _mask(st, p.mem_slices), compute + p.compute_slices, counts, chosen)
            chosen.pop()
            counts[p.key] -= 1
            if not counts[p.key]:
                del counts[p.key]
        dfs(i + 1, mask, compute, counts, chosen)

    dfs(0, 0, 0, {}, [])
    out = tuple(found[k] for k in sorted(found))
    _LAYOUTS[gpu.name] = out
    return out


def solve_aggregated(
    inv: Inventory,
    reqs: Sequence[SlotRequest],
    budget_s: float = DEFAULT_BUDGET_S,
    *,
    anti_affinity: bool = True,
    node_anti_affinity: bool = True,
    prefer_open_nodes: bool = False,
    per_node: bool = False,
    min_devices_used: int | None = None,
) -> ExactResult | None:
    """The fewest-GPU placement of ``reqs`` on the idle MIG GPUs of a cluster of any size, read off the aggregated
    MILP (how many GPUs of each kind run each maximal layout, how many replicas of each class use each profile
    of each kind: GPUs of one kind are interchangeable, so the model's size does not grow with the cluster).

    Every solution is realisable: the GPUs of a kind get the layouts, and each class's replicas the instances of
    their profile, dealt round-robin over nodes and then devices, so a model's replicas land on different nodes
    (devices) wherever the instances allow; a model still all on one node (device) then has one replica swapped
    with a replica of the same profile elsewhere, or moved to an unused instance of it elsewhere (neither changes
    the GPUs used). Anti-affinity is not a constraint of this model: what is left broken is counted by
    :func:`place_batch_exact`, which keeps the heuristic's placement if that breaks fewer. With
    ``prefer_open_nodes`` the layouts first fill nodes in order (few nodes opened), and are dealt over nodes only
    if that breaks a spread.

    ``per_node`` (with ``anti_affinity``; small clusters) makes the model exact for anti-affinity too, as the
    mig-bench's LB+AA bound is: the GPUs of one *node* are the interchangeable unit (one device, on a node that
    is some spread model's only choice), and a spread model never has all its replicas in one node (device)
    unless it gives the spread up, at a cost above every device. ``min_devices_used``: a known lower bound on the
    devices (the model per kind gives one), which lets HiGHS stop as soon as it reaches it.

    None when a candidate GPU already holds something (the per-device MILP,
    :func:`solve_exact`, keeps existing allocations), a request is not a single MIG slot, or no solution came
    within ``budget_s``."""
    t0 = time.perf_counter()
    if not reqs:
        return ExactResult((), True, "empty", 0.0, inv.gpus_in_use())
    if not all(_modelled(r) for r in reqs):
        return None
    devs = _devices(inv)
    if not devs or any(d.fixed_used or d.state.pinned for d in devs):
        return None
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    classes: dict[tuple, list[int]] = {}
    for i, r in enumerate(reqs):
        classes.setdefault((r.memory_gib, r.compute_fraction, tuple(r.gpu_models), r.model), []).append(i)
    # A canonical order (largest first), so the model, and HiGHS's path through it, do not depend on the order
    # the requests came in.
    class_list = sorted(classes, key=lambda k: (-(reqs[classes[k][0]].memory_gib or 0.0), repr(k)))
    creq = [reqs[classes[k][0]] for k in class_list]
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.model] = counts.get(r.model, 0) + 1
    spread = [m for m, n in counts.items() if n >= 2] if per_node and anti_affinity else []
    node_level: dict[str, bool] = {}
    split: set[str] = set()  # nodes whose devices are units of their own (a device-level spread model's nodes)
    for m in spread:
        elig = _eligible_node_names(inv, next(r for r in creq if r.model == m))
        node_level[m] = node_anti_affinity and len(elig) > 1
        if not node_level[m]:
            split |= elig
    # Units of interchangeable GPUs: a kind; with per_node, a node (or one device of a split node).
    by_kind: dict[str, list[_Device]] = {}
    unit_node: dict[str, str] = {}
    for d in devs:
        if not per_node:
            u = d.gpu.name
        elif d.key[0] in split:
            u = f"{d.key[0]}#{d.key[1]}"
        else:
            u = d.key[0]
        by_kind.setdefault(u, []).append(d)
        unit_node[u] = d.key[0]
    gpus = {k: ds[0].gpu for k, ds in by_kind.items()}
    n_gpus = len(devs)
    price_sum = sum(g.price_per_hour * len(by_kind[k]) for k, g in gpus.items()) + 1.0
    w_spread = n_gpus + 1.0
    w_unplaced = w_spread * (len(spread) + 1) + n_gpus + 1.0
    max_price = max(g.price_per_hour for g in gpus.values()) or 1.0
    cost: list[float] = []
    hi: list[float] = []
    y_of: list[tuple[str, tuple[tuple[str, int], ...], int]] = []
    for k, g in gpus.items():
        for lay in maximal_layouts(g):
            y_of.append((k, lay, len(cost)))
            cost.append(1.0 + 0.5 * g.price_per_hour / price_sum)
            hi.append(len(by_kind[k]))
    z_of: dict[tuple[int, str, str], int] = {}
    for ci, r in enumerate(creq):
        allowed = _allowed(inv, r)
        for k, g in gpus.items():
            if allowed is not None and g.name not in allowed:
                continue
            for p in g.profiles_by_size():
                if _fits(g, p, r):
                    z_of[(ci, k, p.key)] = len(cost)
                    # Tie-break (all of them below one GPU): the cheapest slot that fits, as the packer ranks.
                    frac = max(p.compute_slices / g.compute_slices_total, p.mem_slices / g.mem_slices_total)
                    cost.append(0.1 * frac * g.price_per_hour / (max_price * (len(reqs) + 1)))
                    hi.append(len(classes[class_list[ci]]))
    q_of = []
    for k in class_list:
        q_of.append(len(cost))
        cost.append(w_unplaced)
        hi.append(len(classes[k]))
    v_of = {}
    for m in spread:
        v_of[m] = len(cost)
        cost.append(w_spread)
        hi.append(1)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rlo: list[float] = []
    rhi: list[float] = []

    def row(entries: Sequence[tuple[int, float]], low: float, high: float) -> None:
        for j, v in entries:
            rows.append(len(rlo))
            cols.append(j)
            vals.append(v)
        rlo.append(low)
        rhi.append(high)

    for k in gpus:
        row([(j, 1.0) for kk, _, j in y_of if kk == k], 0.0, float(len(by_kind[k])))
    for ci, k in enumerate(class_list):
        row([*((j, 1.0) for (c, _, _), j in z_of.items() if c == ci), (q_of[ci], 1.0)],
            float(len(classes[k])), float(len(classes[k])))
    for k, g in gpus.items():
        for p in g.profiles_by_size():
            users = [(j, 1.0) for (_, kk, key), j in z_of.items() if kk == k and key == p.key]
            if users:
                made = [(j, -float(sum(1 for key, _ in lay if key == p.key))) for kk, lay, j in y_of if kk == k]
                row([*users, *made], -math.inf, 0.0)
    # Anti-affinity (per_node): not all of a spread model's replicas in one node (one device where it is split).
    for m in spread:
        mine = {ci for ci, r in enumerate(creq) if r.model == m}
        groups: dict[str, set[str]] = {}
        for u in by_kind:
            groups.setdefault(unit_node[u] if node_level[m] else u, set()).add(u)
        for members in groups.values():
            es = [(j, 1.0) for (c, u, _), j in z_of.items() if c in mine and u in members]
            if es:
                row([*es, (v_of[m], -float(counts[m]))], -math.inf, float(counts[m] - 1))
    if min_devices_used is not None:
        row([(j, 1.0) for _, _, j in y_of], float(min_devices_used), math.inf)
    # Devices of a split node are interchangeable: used in order (symmetry breaking, as the bound does).
    units = list(by_kind)
    for a, b in itertools.pairwise(units):
        if unit_node[a] == unit_node[b] and a != unit_node[a] and gpus[a] is gpus[b]:
            row([*((j, 1.0) for kk, _, j in y_of if kk == b), *((j, -1.0) for kk, _, j in y_of if kk == a)],
                -math.inf, 0.0)
    obj_max = w_unplaced * len(reqs) + w_spread * len(spread) + n_gpus + 2
    left = budget_s - (time.perf_counter() - t0)
    if left <= 0:
        return None
    A = coo_matrix((vals, (rows, cols)), shape=(len(rlo), len(cost))).tocsr()
    res = milp(np.array(cost), constraints=LinearConstraint(A, np.array(rlo), np.array(rhi)),
               integrality=np.ones(len(cost)), bounds=Bounds(np.zeros(len(cost)), np.array(hi)),
               options={"time_limit": _solver_limit(left), "disp": False, "mip_rel_gap": 0.25 / obj_max})
    if res.x is None:
        return None
    x = np.round(res.x).astype(int)
    # Layouts onto devices, two ways: nodes filled in order (few nodes opened: idle ones stay whole, as
    # ``prefer_open_nodes`` wants; the first two layouts on two nodes, so that a model can still be spread over
    # nodes), or a kind's devices dealt over its nodes in turn (instances of one profile span as many nodes as
    # they can). The first that keeps every spread is taken, else the one that breaks fewest.
    models = {r.model: r for r in reversed(reqs)}
    best: tuple[int, ExactResult] | None = None
    for fill in (True, False) if prefer_open_nodes else (False,):
        slots = _realise(x, by_kind, y_of, z_of, creq, classes, class_list, reqs, fill)
        if slots is None:
            continue
        spare = slots[1]
        placed = slots[0]
        if anti_affinity:
            _repair_spread(inv, reqs, placed, spare, node_anti_affinity)
        trial = inv.copy()
        try:
            for r, sl in zip(reqs, placed, strict=True):
                if sl is not None:
                    trial.allocate(sl, _fresh_owner(trial, r.model), model=r.model)
        except AllocationError:
            continue
        broken = spread_violations(trial, models, node_anti_affinity) if anti_affinity else 0
        if best is None or broken < best[0]:
            best = (broken, ExactResult(tuple(placed), res.status == 0, str(res.message), time.perf_counter() - t0,
                                        trial.gpus_in_use()))
        if broken == 0:
            break
    return None if best is None else best[1]


def _realise(
    x: object, by_kind: Mapping[str, list[_Device]], y_of: list, z_of: Mapping[tuple[int, str, str], int],
    creq: list[SlotRequest], classes: Mapping[tuple, list[int]], class_list: list[tuple],
    reqs: Sequence[SlotRequest], fill: bool,
) -> tuple[list[Slot | None], list[Slot]] | None:
    """The layout-count solution ``x`` on devices: (one slot per request, instances laid out but unused)."""
    slots: list[Slot | None] = [None] * len(reqs)
    spare: list[Slot] = []
    queues = {ci: list(classes[k]) for ci, k in enumerate(class_list)}
    for k, ds in by_kind.items():
        per_node: dict[str, list[_Device]] = {}
        for d in ds:
            per_node.setdefault(d.key[0], []).append(d)
        if fill:
            heads = [v[0] for v in list(per_node.values())[:2]]
            order = heads + [d for d in ds if d not in heads]
            # Layouts dealt in turn, so that each node gets a mix of them.
            lays = _round_robin([[lay] * int(x[j]) for kk, lay, j in y_of if kk == k and x[j] > 0])  # type: ignore[index]
        else:
            order = _round_robin(list(per_node.values()))
            lays = [lay for kk, lay, j in y_of if kk == k for _ in range(int(x[j]))]  # type: ignore[index]
        insts: dict[str, dict[str, list[tuple[_Device, int]]]] = {}  # profile -> node -> instances
        for d, lay in zip(order, lays, strict=False):
            for key, start in lay:
                insts.setdefault(key, {}).setdefault(d.key[0], []).append((d, start))
        for key, nodes in insts.items():
            # Within a node, across devices first; then over nodes in turn.
            dealt = _round_robin([_round_robin(_by_device(v)) for v in nodes.values()])
            for ci in range(len(creq)):
                j = z_of.get((ci, k, key))
                for _ in range(int(x[j]) if j is not None else 0):  # type: ignore[index]
                    if not dealt or not queues[ci]:
                        return None
                    d, start = dealt.pop(0)
                    slots[queues[ci].pop(0)] = Slot.mig(d.key[0], d.key[1], d.gpu, key, start)
            spare.extend(Slot.mig(d.key[0], d.key[1], d.gpu, key, start) for d, start in dealt)
    return slots, spare


def _repair_spread(inv: Inventory, reqs: Sequence[SlotRequest], slots: list[Slot | None], spare: list[Slot],
                   node_level: bool) -> None:
    """Give each model left on one node (device) a replica elsewhere: an unused laid-out instance elsewhere that
    fits it, else an exchange with another model's replica whose instance fits it (and its own fits the other),
    kept only if the other model stays spread.

    ``slots`` (one per request) and ``spare`` (instances laid out but unused) are changed in place. Every replica
    stays on an instance that fits it, and the devices in use stay as they were (or one empties)."""
    index: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        index.setdefault(r.model, []).append(i)
    by_node = {m: node_level and len(_eligible_node_names(inv, reqs[ix[0]])) > 1 for m, ix in index.items()}

    def where(m: str, sl: Slot) -> object:
        return sl.node if by_node[m] else (sl.node, sl.devices[0])

    def broken(m: str) -> bool:
        placed = [slots[i] for i in index[m] if slots[i] is not None]
        return len(placed) >= 2 and len({where(m, sl) for sl in placed if sl is not None}) < 2

    def holds(sl: Slot, r: SlotRequest) -> bool:
        allowed = _allowed(inv, r)
        gpu = inv.catalog.get(sl.gpu_model)
        return (allowed is None or sl.gpu_model in allowed) and _fits(gpu, gpu.profiles[sl.profile], r)  # type: ignore[index]

    for m, ix in index.items():
        if not broken(m):
            continue
        i = next(k for k in reversed(ix) if slots[k] is not None)
        mine = slots[i]
        assert mine is not None
        here = where(m, mine)
        free = next((k for k, sl in enumerate(spare) if holds(sl, reqs[i]) and where(m, sl) != here), None)
        if free is not None:
            slots[i], spare[free] = spare[free], mine
            continue
        for j, other in enumerate(slots):
            if other is None or j in ix or where(m, other) == here:
                continue
            if not (holds(other, reqs[i]) and holds(mine, reqs[j])):
                continue
            slots[i], slots[j] = other, mine
            if not broken(reqs[j].model):
                break
            slots[i], slots[j] = mine, other


def _by_device(insts: list[tuple[_Device, int]]) -> list[list[tuple[_Device, int]]]:
    out: dict[tuple[str, int], list[tuple[_Device, int]]] = {}
    for d, start in insts:
        out.setdefault(d.key, []).append((d, start))
    return list(out.values())


def _round_robin(groups: list[list]) -> list:
    """First of each group, then the second of each, ...: neighbours in the result come from different groups."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def _node_states(inv: Inventory, node: str) -> list[DeviceState]:
    return [inv.device(node, i) for i in range(inv.nodes[node].gpu_count)]


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
    exact_seconds: float  # the whole exact attempt (both models when the per-device one is not tried)
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
    first by default) runs on a copy; :func:`solve_exact` (or, beyond ``max_devices``, :func:`solve_aggregated`)
    runs within ``budget_s``; the exact placement is taken only if it is no worse than the heuristic's in the
    order (unplaced replicas, spreads broken, devices used): never more devices unless it places more replicas
    or keeps more spreads. The packer's ``anti_affinity``, ``node_anti_affinity`` and ``prefer_open_nodes``
    settings are the MILP's. ``outcome``, when given, receives a :class:`BatchOutcome` (for benchmarks and logs).
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
    # Nothing to gain when the heuristic already placed everything on no new device.
    if hkey[0] or hkey[1] or hkey[2] > inv.gpus_in_use():
        t0 = time.perf_counter()
        floor = None
        if len(_devices(inv)) <= max_devices:
            # The layout-count model per node, exact for anti-affinity too (idle clusters only; mostly well under
            # a second here): realised with every spread kept, it is optimal as it stands; else its optimum is a
            # floor that lets the per-device solve stop as soon as it reaches it.
            # First the model per kind (fastest; a floor for both others), then per node, each taken as it
            # stands when realised with every spread kept.
            for per_node in (False, True) if aa else (False,):
                left = budget_s - (time.perf_counter() - t0)
                lb = solve_aggregated(inv, reqs, left / 2, anti_affinity=aa, node_anti_affinity=node_aa,
                                      prefer_open_nodes=open_nodes, per_node=per_node, min_devices_used=floor)
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
                                min_devices_used=floor)
        left = budget_s - (time.perf_counter() - t0)
        if exact is None and left > 0 and len(_devices(inv)) > max_devices:
            exact = solve_aggregated(inv, reqs, left, anti_affinity=aa, node_anti_affinity=node_aa,
                                     prefer_open_nodes=open_nodes)
        secs = time.perf_counter() - t0
    chosen = heur
    if exact is not None:
        ex_inv = inv.copy()
        _allocate(ex_inv, reqs, exact.slots, owners)
        ekey = _key(ex_inv, exact.slots, models, node_aa)
        if ekey <= hkey:  # lexicographic: fewer unplaced first, then fewer spreads broken, then fewer devices
            chosen = list(exact.slots)
    if chosen is heur:
        place_batch(packer, inv, reqs, owners, decreasing=decreasing)
    else:
        _allocate(inv, reqs, chosen, owners)
    if outcome is not None:
        outcome.append(BatchOutcome("heuristic" if chosen is heur else "exact", exact, secs, hkey, ekey))
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
