"""Lower bounds on the GPUs (or dollars) a set of MIG replicas needs: exact MILP or LP relaxation.

The model is aggregated, which is what keeps it small at any cluster size: GPUs of one kind are
interchangeable when packing into MIG instances, so instead of assigning replicas to devices we
choose *how many GPUs of kind k run layout c* (``y[k, c]``, integer) and *how many replicas of
class i use a profile p of kind k* (``z[i, k, p]``, integer), where a class is a distinct
(memory, compute, kinds) request and a layout is a maximal multiset of MIG instances that fits one
GPU at legal placements (non-maximal layouts are dominated: unused instances cost nothing)::

    min   sum_kc y[k,c]                      (or sum_kc price_k * y[k,c])
    s.t.  sum_c y[k,c] <= G_k                    GPUs of each kind
          sum_kp z[i,k,p] = n_i                  every replica placed
          sum_i z[i,k,p] <= sum_c cnt_c(p) y[k,c] instances of each profile on kind k
          z[i,k,p] = 0 unless p gives class i enough memory and compute

A feasible (y, z) is always realisable (give each GPU its layout, each replica one instance of
its profile), so the MILP optimum is the true optimum of MIG-only packing. It ignores
anti-affinity and node boundaries, so for a packer that spreads replicas it is still a valid
lower bound (possibly not attained). Time-slice shares are not modelled (they could pack below
MIG granularity), so a request allowing "share" makes the bound invalid and is refused.

Solved with scipy's HiGHS (``scipy.optimize.milp``); ``exact=False`` drops integrality (the LP
relaxation), whose ceiling is a bound for instances too large to solve exactly in a time limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from sharing.catalog import Catalog, GpuModel, MigProfile, load_catalog
from sharing.slots import NodeSpec, SlotRequest

WHOLE = "whole"  # pseudo-profile: the GPU given whole (non-MIG GPUs, or a request allowing "whole")


@dataclass(frozen=True)
class BoundResult:
    method: str  # "milp" or "lp"
    objective: str  # "gpus" or "cost"
    value: float  # the optimum found (MILP) or the LP optimum
    lower_bound: float  # proven lower bound: the MILP's dual bound, or the LP value
    gpus: float  # GPUs used by the solution found (fractional for the LP)
    cost_per_hour: float  # its price
    optimal: bool  # MILP solved to optimality (always True for a solved LP)
    status: str
    seconds: float
    by_kind: Mapping[str, float] = field(default_factory=dict)

    @property
    def gpu_bound(self) -> int:
        """Integer lower bound on GPUs (objective "gpus"): the ceiling of the proven bound."""
        return math.ceil(self.lower_bound - 1e-6)


def _profile_keys(gpu: GpuModel) -> list[str]:
    return [p.key for p in gpu.profiles_by_size()]  # +me profiles are kept for media work


@lru_cache(maxsize=64)
def _layouts_cached(gpu: GpuModel) -> tuple[tuple[tuple[str, int], ...], ...]:
    if not gpu.mig_capable:
        return (((WHOLE, 1),),)
    profiles = gpu.profiles_by_size()
    options = [(p, s) for p in profiles for s in p.placements if s + p.mem_slices <= gpu.mem_slices_total]
    found: set[tuple[tuple[str, int], ...]] = set()

    def can_add(mask: int, compute: int, counts: dict[str, int], p: MigProfile, s: int) -> bool:
        r = ((1 << p.mem_slices) - 1) << s
        return (
            not mask & r
            and counts.get(p.key, 0) < p.max_count
            and compute + p.compute_slices <= gpu.compute_slices_total
        )

    def dfs(i: int, mask: int, compute: int, counts: dict[str, int]) -> None:
        if i == len(options):
            # Maximal only: nothing more can be added anywhere.
            if not any(can_add(mask, compute, counts, p, s) for p, s in options):
                found.add(tuple(sorted(counts.items())))
            return
        p, s = options[i]
        if can_add(mask, compute, counts, p, s):
            counts[p.key] = counts.get(p.key, 0) + 1
            dfs(i + 1, mask | (((1 << p.mem_slices) - 1) << s), compute + p.compute_slices, counts)
            counts[p.key] -= 1
            if not counts[p.key]:
                del counts[p.key]
        dfs(i + 1, mask, compute, counts)

    dfs(0, 0, 0, {})
    return (*sorted(found), ((WHOLE, 1),))


def mig_layouts(gpu: GpuModel) -> list[dict[str, int]]:
    """Maximal MIG layouts of one GPU as profile counts (plus ``{"whole": 1}``), e.g. 28 on H100."""
    return [dict(c) for c in _layouts_cached(gpu)]


def _fits(gpu: GpuModel, key: str, req: SlotRequest) -> bool:
    mem = req.memory_gib
    if key == WHOLE:
        return "whole" in req.kinds and (mem is None or gpu.memory_gib >= mem) and req.compute_fraction <= 1.0
    p = gpu.profiles[key]
    return (
        "mig" in req.kinds
        and mem is not None
        and p.memory_gib >= mem
        and gpu.compute_fraction(p) >= req.compute_fraction
    )


def _eligible_nodes(nodes: Sequence[NodeSpec], cat: Catalog, req: SlotRequest) -> list[str]:
    """Names of the nodes that could hold one replica of ``req``: its GPU kinds, and a slot big enough.

    The packer's spread filter applies only when some candidate passes it, so a model whose
    replicas fit on one node only is spread over that node's devices, not across nodes.
    """
    allowed = {cat.resolve(m) for m in req.gpu_models if m in cat} if req.gpu_models else None
    out = []
    for n in nodes:
        gpu = cat.get(n.gpu_model)
        if not n.gpu_count or (allowed is not None and gpu.name not in allowed):
            continue
        keys = [*_profile_keys(gpu), WHOLE] if n.mig_enabled and gpu.mig_capable else [WHOLE]
        if any(_fits(gpu, k, req) for k in keys):
            out.append(n.name)
    return out


def lower_bound(
    nodes: Sequence[NodeSpec],
    requests: Sequence[SlotRequest],
    catalog: Catalog | None = None,
    *,
    exact: bool = True,
    objective: str = "gpus",
    anti_affinity: bool = False,
    time_limit_s: float = 20.0,
) -> BoundResult:
    """Fewest GPUs (or least $/h) that can host ``requests`` on the GPUs of ``nodes``, from scratch.

    Each request is one replica needing one slot. ``exact`` solves the MILP (its ``lower_bound``
    is HiGHS's dual bound, equal to ``value`` when ``optimal``); otherwise the LP relaxation.
    ``anti_affinity`` adds :class:`~sharing.packer.CostAwarePacker`'s spreading rule as a hard
    constraint: a model with two or more replicas (by ``req.model``) never has them all on one node
    when its GPU kinds span several nodes, else never all on one device. Capacity is then modelled
    per node (per device on such a model's only node) instead of per kind, which is larger but
    still solves in well under a second on <= 16 GPUs. The result bounds packings that keep
    anti-affinity; it is infinite when none exists.
    Raises ValueError for requests the model cannot represent (time-slice shares, multi-GPU).
    """
    if objective not in ("gpus", "cost"):
        raise ValueError(f"objective must be 'gpus' or 'cost', got {objective!r}")
    cat = catalog if catalog is not None else load_catalog()
    t0 = time.perf_counter()
    for r in requests:
        if "share" in r.kinds:
            raise ValueError(f"{r.model}: time-slice shares are not modelled; a MIG/whole bound would be invalid")
        if r.gpus != 1:
            raise ValueError(f"{r.model}: multi-GPU replicas are not modelled")
    # Units of capacity. Without anti-affinity GPUs of one kind are interchangeable, so a unit is
    # a (kind, MIG mode); with it, where a replica sits matters, so a unit is a node, or a single
    # device on a node that is some spread model's only eligible node (the packer's rule then
    # spreads over devices, not nodes).
    units: list[tuple[str, bool, int, str | None]] = []  # (kind, MIG mode, GPUs, node or None)
    unit_of_kind: dict[tuple[str, bool], int] = {}
    spread: dict[str, int] = {}  # model -> replicas, for models anti-affinity constrains
    if anti_affinity:
        for r in requests:
            spread[r.model] = spread.get(r.model, 0) + 1
        spread = {m: n for m, n in spread.items() if n >= 2}
    eligible: dict[str, list[str]] = {m: _eligible_nodes(nodes, cat, r) for r in requests if (m := r.model) in spread}
    split = {ns[0] for ns in eligible.values() if len(ns) == 1}
    ordered: set[int] = set()  # unit u and u + 1 are devices of one split node
    for n in nodes:
        if not n.gpu_count:
            continue
        gpu = cat.get(n.gpu_model)
        k = (gpu.name, bool(n.mig_enabled and gpu.mig_capable))
        if not anti_affinity:
            if k not in unit_of_kind:
                unit_of_kind[k] = len(units)
                units.append((k[0], k[1], 0, None))
            u = unit_of_kind[k]
            units[u] = (k[0], k[1], units[u][2] + n.gpu_count, None)
        elif n.name in split:
            # Each device its own unit; consecutive ones of this node are ordered below.
            ordered.update(range(len(units), len(units) + n.gpu_count - 1))
            units.extend((k[0], k[1], 1, f"{n.name}#{i}") for i in range(n.gpu_count))
        else:
            units.append((k[0], k[1], n.gpu_count, n.name))
    total_gpus = sum(u[2] for u in units)

    # Replicas with the same needs are interchangeable: one class each keeps the model small (with
    # anti-affinity a spread model's replicas form their own class, so its spread can be limited).
    def class_key(r: SlotRequest) -> tuple:
        own = r.model if r.model in spread else None
        return (r.memory_gib, r.compute_fraction, tuple(sorted(r.kinds)), tuple(r.gpu_models), own)

    classes: dict[tuple, int] = {}
    class_reqs: dict[tuple, SlotRequest] = {}
    for r in requests:
        key = class_key(r)
        classes[key] = classes.get(key, 0) + 1
        class_reqs.setdefault(key, r)

    # Variable layout: y[u, c] first, then z[i, u, p].
    y_index: list[tuple[int, dict[str, int]]] = []
    gpus_of = [cat.get(u[0]) for u in units]
    for ui, (_name, mig, _n, _node) in enumerate(units):
        layouts = mig_layouts(gpus_of[ui]) if mig else [{WHOLE: 1}]
        for c in layouts:
            y_index.append((ui, c))
    z_index: list[tuple[int, int, str]] = []
    class_list = list(classes)
    for ci, ck in enumerate(class_list):
        req = class_reqs[ck]
        allowed = {cat.resolve(m) for m in req.gpu_models if m in cat} if req.gpu_models else None
        for ui, (name, mig, _n, _node) in enumerate(units):
            if allowed is not None and name not in allowed:
                continue
            gpu = gpus_of[ui]
            keys = [*_profile_keys(gpu), WHOLE] if mig else [WHOLE]
            for key in keys:
                if _fits(gpu, key, req):
                    z_index.append((ci, ui, key))
    ny, nz = len(y_index), len(z_index)
    nv = ny + nz
    price = np.array([gpus_of[ki].price_per_hour for ki, _ in y_index])
    c = np.zeros(nv)
    c[:ny] = 1.0 if objective == "gpus" else price
    if objective == "gpus":
        # A tiny price term picks the cheapest among GPU-optimal solutions without changing the optimum
        # (it is below one GPU in total).
        c[:ny] += price / (price.sum() * (1 + total_gpus) + 1.0)
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    for ui, unit in enumerate(units):
        row = np.zeros(nv)
        row[[j for j, (k, _) in enumerate(y_index) if k == ui]] = 1
        rows.append(row)
        lo.append(0)
        hi.append(unit[2])
    for ci, ck in enumerate(class_list):
        row = np.zeros(nv)
        row[[ny + j for j, (i, _, _) in enumerate(z_index) if i == ci]] = 1
        rows.append(row)
        lo.append(classes[ck])
        hi.append(classes[ck])
    for ki in range(len(units)):
        keys = {key for (_, k, key) in z_index if k == ki}
        for key in keys:
            row = np.zeros(nv)
            row[[ny + j for j, (_, k, p) in enumerate(z_index) if k == ki and p == key]] = 1
            for j, (k, layout) in enumerate(y_index):
                if k == ki:
                    row[j] = -layout.get(key, 0)
            rows.append(row)
            lo.append(-np.inf)
            hi.append(0)
    # Anti-affinity, as the packer applies it: a spread model (>= 2 replicas) never has all of them
    # in one unit (node, or device where its only eligible node was split into devices).
    # (A model's replicas may form several classes if their requests differ: the row sums them.)
    for m, n in spread.items():
        mine = {ci for ci, ck in enumerate(class_list) if ck[-1] == m}
        for ui in range(len(units)):
            cols = [ny + j for j, (i, u, _) in enumerate(z_index) if i in mine and u == ui]
            if cols:
                row = np.zeros(nv)
                row[cols] = 1
                rows.append(row)
                lo.append(-np.inf)
                hi.append(n - 1)
    # Devices split out of one node are interchangeable: use them in order (symmetry breaking,
    # which keeps the exact solve fast without changing the optimum).
    for ui in sorted(ordered):
        row = np.zeros(nv)
        row[[j for j, (k, _) in enumerate(y_index) if k == ui]] = -1
        row[[j for j, (k, _) in enumerate(y_index) if k == ui + 1]] = 1
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0)
    if {i for i, _, _ in z_index} != set(range(len(class_list))):
        return BoundResult(
            "milp" if exact else "lp",
            objective,
            math.inf,
            math.inf,
            math.inf,
            math.inf,
            True,
            "infeasible: a request fits no GPU kind",
            time.perf_counter() - t0,
        )
    ub = np.full(nv, np.inf)
    for j, (ki, _) in enumerate(y_index):
        ub[j] = units[ki][2]
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows), lo, hi),
        integrality=np.ones(nv) if exact else np.zeros(nv),
        bounds=Bounds(np.zeros(nv), ub),
        options={"time_limit": time_limit_s, "disp": False},
    )
    secs = time.perf_counter() - t0
    method = "milp" if exact else "lp"
    if res.x is None:
        return BoundResult(method, objective, math.inf, math.inf, math.inf, math.inf, False, res.message, secs)
    y = res.x[:ny]
    gpus = float(y.sum())
    cost = float(price @ y)
    value = gpus if objective == "gpus" else cost
    optimal = res.status == 0
    if exact:
        dual = getattr(res, "mip_dual_bound", None)
        bound = value if optimal or dual is None or not math.isfinite(dual) else float(dual)
        if objective == "gpus" and not optimal:
            bound = min(bound, value)
    else:
        bound = value
    by_kind: dict[str, float] = {}
    for j, (ki, _) in enumerate(y_index):
        if y[j] > 1e-9:
            by_kind[units[ki][0]] = by_kind.get(units[ki][0], 0.0) + float(y[j])
    return BoundResult(method, objective, value, bound, gpus, cost, optimal, res.message, secs, by_kind)
