"""The layout-count models of a batch of MIG replicas on idle GPUs, and how their answer is laid on devices.

GPUs of one kind (with ``per_node``: of one node) are interchangeable on an idle cluster, so the model counts
how many of them run each maximal layout and how many replicas of each class use each profile of each unit;
its size does not grow with the cluster. :func:`sharing.mig_exact.place_batch_exact` tries it first on small
idle clusters and beyond the per-device MILP's reach; see :mod:`sharing.mig_exact` for the order.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharing.catalog import GpuModel, MigProfile
from sharing.mig_exact_model import (
    DEFAULT_BUDGET_S,
    Classes,
    Device,
    ExactResult,
    Milp,
    Solution,
    allocated_copy,
    allowed_models,
    candidate_devices,
    eligible_node_names,
    fits,
    group_classes,
    modelled,
    slice_mask,
    spread_violations,
)
from sharing.slots import Inventory, Slot, SlotRequest

# GPU model name -> its maximal layouts (they depend on the model only, and are costly to enumerate).
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
        return (not mask & slice_mask(st, p.mem_slices) and counts.get(p.key, 0) < p.max_count
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
            dfs(i + 1, mask | slice_mask(st, p.mem_slices), compute + p.compute_slices, counts, chosen)
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
    cuts: list[str] | None = None,
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
    within the node limit or the safety cut ``budget_s`` (when the cut fires a line goes to ``cuts``)."""
    t0 = time.perf_counter()
    if not reqs:
        return ExactResult((), True, "empty", 0.0, inv.gpus_in_use())
    if not all(modelled(r) for r in reqs):
        return None
    devs = candidate_devices(inv)
    if not devs or any(d.fixed_used or d.state.pinned for d in devs):
        return None
    cl = group_classes(reqs, lambda r: (r.memory_gib, r.compute_fraction, tuple(r.gpu_models), r.model))
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.model] = counts.get(r.model, 0) + 1
    spread = [m for m, n in counts.items() if n >= 2] if per_node and anti_affinity else []
    units = _units(inv, devs, cl.first, spread, per_node, node_anti_affinity)
    model = Milp()
    lv = _layout_variables(model, inv, units, cl, spread, len(reqs), len(devs))
    _layout_rows(model, units, lv, cl, spread, counts, min_devices_used)
    obj_max = lv.w_unplaced * len(reqs) + lv.w_spread * len(spread) + len(devs) + 2
    left = budget_s - (time.perf_counter() - t0)
    if left <= 0:
        if cuts is not None:
            cuts.append("no time left to solve the layout-count MILP")
        return None
    sol = model.solve(left, obj_max, cuts)
    if sol is None:
        return None
    return _best_realisation(inv, reqs, sol, units, lv, cl, t0, anti_affinity, node_anti_affinity,
                             prefer_open_nodes)


@dataclass(frozen=True)
class _Units:
    """The interchangeable units of GPUs: a kind; with ``per_node``, a node (or one device of a split node)."""

    by_kind: dict[str, list[Device]]  # unit -> its devices
    unit_node: dict[str, str]  # unit -> its node
    gpus: dict[str, GpuModel]  # unit -> its GPU model
    node_level: dict[str, bool]  # spread model -> spread over nodes (else over devices)


@dataclass(frozen=True)
class _LayoutVars:
    y_of: list[tuple[str, tuple[tuple[str, int], ...], int]]  # (unit, layout, var): units running the layout
    z_of: dict[tuple[int, str, str], int]  # (class, unit, profile) -> var: replicas on that profile
    q_of: list[int]  # per class: replicas left unplaced
    v_of: dict[str, int]  # per spread model: its spread given up
    w_unplaced: float
    w_spread: float


def _units(inv: Inventory, devs: Sequence[Device], creq: Sequence[SlotRequest], spread: Sequence[str],
           per_node: bool, node_anti_affinity: bool) -> _Units:
    node_level: dict[str, bool] = {}
    split: set[str] = set()  # nodes whose devices are units of their own (a device-level spread model's nodes)
    for m in spread:
        elig = eligible_node_names(inv, next(r for r in creq if r.model == m))
        node_level[m] = node_anti_affinity and len(elig) > 1
        if not node_level[m]:
            split |= elig
    by_kind: dict[str, list[Device]] = {}
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
    return _Units(by_kind, unit_node, {k: ds[0].gpu for k, ds in by_kind.items()}, node_level)


def _layout_variables(m: Milp, inv: Inventory, units: _Units, cl: Classes, spread: Sequence[str],
                      n_reqs: int, n_gpus: int) -> _LayoutVars:
    """Variables, in order: layouts per unit, replicas per class and profile, unplaced, spreads given up. The
    weights make the objective lexicographic: unplaced, then spreads, then GPUs, then (below one GPU) price."""
    by_kind, gpus = units.by_kind, units.gpus
    price_sum = sum(g.price_per_hour * len(by_kind[k]) for k, g in gpus.items()) + 1.0
    w_spread = n_gpus + 1.0
    w_unplaced = w_spread * (len(spread) + 1) + n_gpus + 1.0
    max_price = max(g.price_per_hour for g in gpus.values()) or 1.0
    y_of: list[tuple[str, tuple[tuple[str, int], ...], int]] = []
    for k, g in gpus.items():
        for lay in maximal_layouts(g):
            y_of.append((k, lay, m.var(1.0 + 0.5 * g.price_per_hour / price_sum, len(by_kind[k]))))
    z_of: dict[tuple[int, str, str], int] = {}
    for ci, r in enumerate(cl.first):
        allowed = allowed_models(inv, r)
        for k, g in gpus.items():
            if allowed is not None and g.name not in allowed:
                continue
            for p in g.profiles_by_size():
                if fits(g, p, r):
                    # Tie-break (all of them below one GPU): the cheapest slot that fits, as the packer ranks.
                    frac = max(p.compute_slices / g.compute_slices_total, p.mem_slices / g.mem_slices_total)
                    z_of[(ci, k, p.key)] = m.var(0.1 * frac * g.price_per_hour / (max_price * (n_reqs + 1)),
                                                 len(cl.members[cl.order[ci]]))
    q_of = [m.var(w_unplaced, len(cl.members[k])) for k in cl.order]
    v_of = {s: m.var(w_spread, 1) for s in spread}
    return _LayoutVars(y_of, z_of, q_of, v_of, w_unplaced, w_spread)


def _layout_rows(m: Milp, units: _Units, lv: _LayoutVars, cl: Classes, spread: Sequence[str],
                 counts: Mapping[str, int], min_devices_used: int | None) -> None:
    by_kind, gpus, unit_node = units.by_kind, units.gpus, units.unit_node
    y_of, z_of = lv.y_of, lv.z_of
    # Each unit runs at most as many layouts as it has GPUs.
    for k in gpus:
        m.row([(j, 1.0) for kk, _, j in y_of if kk == k], 0.0, float(len(by_kind[k])))
    # Every replica placed or counted unplaced.
    for ci, k in enumerate(cl.order):
        m.row([*((j, 1.0) for (c, _, _), j in z_of.items() if c == ci), (lv.q_of[ci], 1.0)],
              float(len(cl.members[k])), float(len(cl.members[k])))
    # Replicas on a profile of a unit: at most the instances of it its layouts make.
    for k, g in gpus.items():
        for p in g.profiles_by_size():
            users = [(j, 1.0) for (_, kk, key), j in z_of.items() if kk == k and key == p.key]
            if users:
                made = [(j, -float(sum(1 for key, _ in lay if key == p.key))) for kk, lay, j in y_of if kk == k]
                m.row([*users, *made], -math.inf, 0.0)
    # Anti-affinity (per_node): not all of a spread model's replicas in one node (one device where it is split).
    for s in spread:
        mine = {ci for ci, r in enumerate(cl.first) if r.model == s}
        groups: dict[str, set[str]] = {}
        for u in by_kind:
            groups.setdefault(unit_node[u] if units.node_level[s] else u, set()).add(u)
        for members in groups.values():
            es = [(j, 1.0) for (c, u, _), j in z_of.items() if c in mine and u in members]
            if es:
                m.row([*es, (lv.v_of[s], -float(counts[s]))], -math.inf, float(counts[s] - 1))
    if min_devices_used is not None:
        m.row([(j, 1.0) for _, _, j in y_of], float(min_devices_used), math.inf)
    # Devices of a split node are interchangeable: used in order (symmetry breaking, as the bound does).
    for a, b in itertools.pairwise(list(by_kind)):
        if unit_node[a] == unit_node[b] and a != unit_node[a] and gpus[a] is gpus[b]:
            m.row([*((j, 1.0) for kk, _, j in y_of if kk == b), *((j, -1.0) for kk, _, j in y_of if kk == a)],
                  -math.inf, 0.0)


def _best_realisation(inv: Inventory, reqs: Sequence[SlotRequest], sol: Solution, units: _Units,
                      lv: _LayoutVars, cl: Classes, t0: float, anti_affinity: bool, node_anti_affinity: bool,
                      prefer_open_nodes: bool) -> ExactResult | None:
    """Layouts onto devices, two ways: nodes filled in order (few nodes opened: idle ones stay whole, as
    ``prefer_open_nodes`` wants; the first two layouts on two nodes, so that a model can still be spread over
    nodes), or a kind's devices dealt over its nodes in turn (instances of one profile span as many nodes as
    they can). The first that keeps every spread is taken, else the one that breaks fewest."""
    models = {r.model: r for r in reversed(reqs)}
    best: tuple[int, ExactResult] | None = None
    for fill in (True, False) if prefer_open_nodes else (False,):
        slots = _realise(sol.x, units.by_kind, lv.y_of, lv.z_of, cl.first, cl.members, cl.order, reqs, fill)
        if slots is None:
            continue
        placed, spare = slots
        if anti_affinity:
            _repair_spread(inv, reqs, placed, spare, node_anti_affinity)
        trial = allocated_copy(inv, reqs, placed)
        if trial is None:
            continue
        broken = spread_violations(trial, models, node_anti_affinity) if anti_affinity else 0
        if best is None or broken < best[0]:
            best = (broken, ExactResult(tuple(placed), sol.optimal, sol.message, time.perf_counter() - t0,
                                        trial.gpus_in_use()))
        if broken == 0:
            break
    return None if best is None else best[1]


def _realise(
    x: object, by_kind: Mapping[str, list[Device]], y_of: list, z_of: Mapping[tuple[int, str, str], int],
    creq: list[SlotRequest], classes: Mapping[tuple, list[int]], class_list: list[tuple],
    reqs: Sequence[SlotRequest], fill: bool,
) -> tuple[list[Slot | None], list[Slot]] | None:
    """The layout-count solution ``x`` on devices: (one slot per request, instances laid out but unused)."""
    slots: list[Slot | None] = [None] * len(reqs)
    spare: list[Slot] = []
    queues = {ci: list(classes[k]) for ci, k in enumerate(class_list)}
    for k, ds in by_kind.items():
        per_node: dict[str, list[Device]] = {}
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
        insts: dict[str, dict[str, list[tuple[Device, int]]]] = {}  # profile -> node -> instances
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
    by_node = {m: node_level and len(eligible_node_names(inv, reqs[ix[0]])) > 1 for m, ix in index.items()}

    def where(m: str, sl: Slot) -> object:
        return sl.node if by_node[m] else (sl.node, sl.devices[0])

    def broken(m: str) -> bool:
        placed = [slots[i] for i in index[m] if slots[i] is not None]
        return len(placed) >= 2 and len({where(m, sl) for sl in placed if sl is not None}) < 2

    def holds(sl: Slot, r: SlotRequest) -> bool:
        allowed = allowed_models(inv, r)
        gpu = inv.catalog.get(sl.gpu_model)
        return (allowed is None or sl.gpu_model in allowed) and fits(gpu, gpu.profiles[sl.profile], r)  # type: ignore[index]

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


def _by_device(insts: list[tuple[Device, int]]) -> list[list[tuple[Device, int]]]:
    out: dict[tuple[str, int], list[tuple[Device, int]]] = {}
    for d, start in insts:
        out.setdefault(d.key, []).append((d, start))
    return list(out.values())


def _round_robin(groups: list[list]) -> list:
    """First of each group, then the second of each, ...: neighbours in the result come from different groups."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out
