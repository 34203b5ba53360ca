"""What the two exact MIG models share: the candidate devices, the rules a replica must meet, a sparse MILP
builder, the result type, and the spread count they are judged by.

:mod:`sharing.mig_exact` (the per-device MILP and the entry point) and :mod:`sharing.mig_exact_layouts` (the
layout-count models) both build on these, so they live below both (no import cycle). The solver is imported
inside :meth:`Milp.solve` only: importing :mod:`sharing` stays dependency-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sharing.catalog import GpuModel, MigProfile
from sharing.slots import AllocationError, DeviceState, Inventory, Slot, SlotRequest

# How much work one solve may do: HiGHS's branch-and-bound node limit. The limit is work, not time, so a snapshot gets
# the same plan on any machine and under any load (HiGHS is deterministic short of a time limit). On the mig-bench's
# instances (<= 16 GPUs, up to ~1,200 variables) 100 nodes are at most 1.3 s on this 2-core VM, root node included,
# and find the device counts a solve of thousands of nodes proves (docs/sharing.md, "Exact placement").
DEFAULT_NODE_LIMIT = 100
# The wall-clock safety cut over a whole exact placement: it fires only when the machine is far slower than the work
# limit assumes, and is counted then (BatchOutcome.budget_exceeded, the controller's
# slotwise_exact_budget_exceeded_total): that plan may differ from run to run.
DEFAULT_BUDGET_S = 5.0
DEFAULT_MAX_DEVICES = 16  # "small" instances: candidate MIG GPUs the MILP is tried on


@dataclass(frozen=True)
class ExactResult:
    """The MILP's answer: one slot (or None: left unplaced) per request, and what HiGHS said."""

    slots: tuple[Slot | None, ...]
    optimal: bool  # HiGHS proved the device count optimal (within its gap) in the node limit
    status: str
    seconds: float
    devices_used: int  # devices holding something after the placement (existing ones included)


@dataclass(frozen=True)
class Device:
    """A candidate device of the exact models: MIG on, not held whole."""

    key: tuple[str, int]
    state: DeviceState
    gpu: GpuModel
    options: tuple[tuple[MigProfile, int], ...]  # new instances that can be created on it now
    free_pinned: tuple[tuple[str, int], ...]  # existing instances with no occupant
    fixed_used: bool  # already holds something


@dataclass(frozen=True)
class Classes:
    """Replica classes: requests of one shape, placed as one count."""

    members: dict[tuple, list[int]]  # class key -> indices of its requests
    order: list[tuple]  # the class keys in a canonical order
    first: list[SlotRequest]  # per class (in order), its first request


def group_classes(reqs: Sequence[SlotRequest], key: Callable[[SlotRequest], tuple]) -> Classes:
    classes: dict[tuple, list[int]] = {}
    for i, r in enumerate(reqs):
        classes.setdefault(key(r), []).append(i)
    # A canonical order (largest first), so the model, and HiGHS's path through it, do not depend on the order
    # the requests came in.
    class_list = sorted(classes, key=lambda k: (-(reqs[classes[k][0]].memory_gib or 0.0), repr(k)))
    return Classes(classes, class_list, [reqs[classes[k][0]] for k in class_list])


@dataclass(frozen=True)
class Solution:
    """What HiGHS returned: the rounded values (None: no solution in the time limit) and its status."""

    x: object  # numpy int array, one value per variable
    optimal: bool
    message: str


@dataclass
class Milp:
    """A MILP being built: integer variables in ``[0, upper]`` and sparse rows ``low <= sum <= high``.

    Variables and rows are numbered in the order they are added; the models add them in a fixed order, so the
    model, and HiGHS's path through it, depend only on the instance."""

    cost: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    rlo: list[float] = field(default_factory=list)
    rhi: list[float] = field(default_factory=list)

    def var(self, cost: float, upper: float) -> int:
        self.cost.append(cost)
        self.hi.append(upper)
        return len(self.cost) - 1

    def row(self, entries: Sequence[tuple[int, float]], low: float, high: float) -> None:
        r = len(self.rlo)
        for j, v in entries:
            self.rows.append(r)
            self.cols.append(j)
            self.vals.append(v)
        self.rlo.append(low)
        self.rhi.append(high)

    def solve(self, left_s: float, obj_max: float, cuts: list[str] | None = None,
              node_limit: int = DEFAULT_NODE_LIMIT) -> Solution | None:
        """Solve with HiGHS within ``node_limit`` branch-and-bound nodes (the work limit: the answer depends on the
        instance only), cut short by what is left of the wall-clock budget, ``left_s`` (the safety cut: when it
        fires, a line is appended to ``cuts``). None: no solution. A relative gap of a quarter of a unit on the
        largest objective possible proves the counts the objective weighs above its tie-breaks."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        n = len(self.cost)
        A = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.rlo), n)).tocsr()
        res = milp(np.array(self.cost), constraints=LinearConstraint(A, np.array(self.rlo), np.array(self.rhi)),
                   integrality=np.ones(n), bounds=Bounds(np.zeros(n), np.array(self.hi)),
                   options={"time_limit": solver_limit(left_s), "node_limit": int(node_limit), "disp": False,
                            "mip_rel_gap": 0.25 / obj_max})
        # scipy's "Time limit reached. (HiGHS Status 13 ...)", status 1; the node limit is HiGHS's solution limit,
        # which scipy 1.17 reports as status 4 (read by the words: the numbers are scipy's mapping, not HiGHS's)
        if cuts is not None and "time limit" in str(res.message).lower():
            cuts.append(f"time limit of {solver_limit(left_s):.2f} s: {res.message}")
        if res.x is None:
            return None
        return Solution(np.round(res.x).astype(int), res.status == 0, str(res.message))


def solver_limit(left_s: float) -> float:
    """HiGHS's time limit out of what is left of the budget: it overruns its limit a little, and reading the
    placement off and checking it with the Inventory takes the rest."""
    return max(0.9 * left_s - 0.02, 1e-3)


def slice_mask(start: int, size: int) -> int:
    """The memory slices ``[start, start + size)`` as a bit mask."""
    return ((1 << size) - 1) << start


def modelled(req: SlotRequest) -> bool:
    """A request the exact models can place: one MIG slot of a known memory size."""
    return "mig" in req.kinds and not req.whole_only and req.memory_gib is not None and req.gpus == 1


def fits(gpu: GpuModel, p: MigProfile, req: SlotRequest) -> bool:
    return p.memory_gib >= (req.memory_gib or math.inf) and gpu.compute_fraction(p) >= req.compute_fraction


def allowed_models(inv: Inventory, req: SlotRequest) -> set[str] | None:
    """The GPU models ``req`` may use (canonical names), None for any."""
    return {inv.catalog.resolve(m) for m in req.gpu_models if m in inv.catalog} if req.gpu_models else None


def candidate_devices(inv: Inventory) -> list[Device]:
    out = []
    for key, d in inv.devices.items():
        if not d.mig_enabled or not d.gpu.mig_capable or d.whole_owner is not None:
            continue
        opts = tuple((p, s) for p in d.gpu.profiles_by_size() for s in p.placements if d.can_create(p, s))
        free = tuple(inst for inst in d.pinned if inst not in d.usage)
        out.append(Device(key, d, d.gpu, opts, free, bool(d.entries)))
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
        eligible = eligible_node_names(inv, req)
        if node_level and len(eligible) > 1:
            bad += len(nodes) < 2
        else:
            bad += len(devs) < 2
    return bad


def eligible_node_names(inv: Inventory, req: SlotRequest) -> set[str]:
    """Nodes with a MIG GPU some profile of which holds ``req`` (the bound's notion of where a model can go)."""
    allowed = allowed_models(inv, req)
    out = set()
    for n in inv.nodes.values():
        if not n.gpu_count or not n.mig_enabled or (allowed is not None and n.gpu_model not in allowed):
            continue
        gpu = inv.catalog.get(n.gpu_model)
        if gpu.mig_capable and any(fits(gpu, p, req) for p in gpu.profiles_by_size()):
            out.add(n.name)
    return out


def node_states(inv: Inventory, node: str) -> list[DeviceState]:
    return [inv.device(node, i) for i in range(inv.nodes[node].gpu_count)]


def fresh_owner(inv: Inventory, model: str) -> str:
    """An owner name for a trial allocation that clashes with none in ``inv``."""
    n = inv.model_allocation_count(model)
    owners = {o for o, _ in inv.allocations()}
    while f"{model}/x{n}" in owners:
        n += 1
    return f"{model}/x{n}"


def allocated_copy(inv: Inventory, reqs: Sequence[SlotRequest], slots: Sequence[Slot | None]) -> Inventory | None:
    """A copy of ``inv`` with ``slots`` allocated (fresh owners); None if the Inventory (the authority on legality)
    refuses one of them."""
    trial = inv.copy()
    try:
        for r, s in zip(reqs, slots, strict=True):
            if s is not None:
                trial.allocate(s, fresh_owner(trial, r.model), model=r.model)
    except AllocationError:
        return None
    return trial


def checked_gpus_in_use(inv: Inventory, reqs: Sequence[SlotRequest], slots: Sequence[Slot | None]) -> int | None:
    """The GPUs in use once ``slots`` are allocated on a copy of ``inv``; None if the Inventory refuses one."""
    trial = allocated_copy(inv, reqs, slots)
    return None if trial is None else trial.gpus_in_use()
