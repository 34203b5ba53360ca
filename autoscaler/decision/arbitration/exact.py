"""The asks served in order, placed again exactly when that uses fewer GPUs (small MIG clusters, issue 19).

The in-order path places one replica at a time with the packer, which on a handful of MIG GPUs often opens one GPU
more than the batch needs (one GPU is +11-20% there). When every replica placed this way is one MIG-capable pod of a
known memory size and counts for one replica whatever its slot (no ``speed``), the whole batch is handed to
:func:`sharing.mig_exact.place_batch_exact` (the per-device MILP within ``budget_s``, every running replica and lent
GPU fixed where it is) and its placement replaces the in-order one only when it keeps every replica placed, breaks
no more spreads and uses strictly fewer GPUs, and no team passes its limit with the slots it gets (a MIG slice is
charged by its size, so the GPU-equivalents a team holds can change). Otherwise nothing changes: the exact step can
only save GPUs, and the live MIG re-layout (``live/node_actions.mig_layout_actions`` follows the placements) carries
out what it chose.

The cost is paid only on ticks whose in-order placement opens a GPU (``place_batch_exact`` returns at once when its
heuristic needs no new device), and never beyond the budget.
"""

from __future__ import annotations

from autoscaler.decision.arbitration.damage import EPS
from autoscaler.decision.arbitration.tick import Tick
from autoscaler.decision.arbitration.types import Ask
from sharing.mig_exact import place_batch_exact
from sharing.mig_exact_model import modelled, spread_violations
from sharing.packer import allocate_group, group_fraction
from sharing.slots import Slot

Placed = tuple[Ask, str, tuple[Slot, ...]]  # an ask, the replica's owner id, its slots


def eligible(log: list[Placed]) -> bool:
    """Replicas the exact placement can move: single pods, one MIG slot of a known size, one replica each."""
    return bool(log) and all(a.pods == 1 and a.speed is None and modelled(a.request) for a, _, _ in log)


def reseat_exact(t: Tick, log: list[Placed], budget_s: float, gpus_in_use_before: int) -> list[Placed]:
    """``log`` (what the in-order path allocated on ``t.inv``, which had ``gpus_in_use_before`` GPUs in use before
    it), placed again by the exact batch placement when that uses fewer GPUs by the rules of the module docstring:
    ``t.inv`` and ``t.usage`` changed to match, and the new log returned; else ``log`` as it was and nothing
    changed."""
    if budget_s <= 0 or not eligible(log) or t.inv.gpus_in_use() <= gpus_in_use_before:
        return log  # (the last: the in-order placement opened no GPU, so none can be saved)
    trial = t.inv.copy()
    for _a, owner, slots in reversed(log):
        for slot in reversed(slots):
            trial.release(slot, owner)
    reqs = [a.request for a, _, _ in log]
    owners = [owner for _, owner, _ in log]
    outcome: list = []
    new = place_batch_exact(t.packer, trial, reqs, budget_s, owners, outcome=outcome)
    if outcome[0].used != "exact" or any(s is None for s in new):
        return log
    node_level = bool(getattr(t.packer, "node_anti_affinity", True))
    models = {r.model: r for r in reversed(reqs)}
    before = (spread_violations(t.inv, models, node_level), t.inv.gpus_in_use())
    after = (spread_violations(trial, models, node_level), trial.gpus_in_use())
    if not (after[0] <= before[0] and after[1] < before[1]):
        return log
    usage = dict(t.usage)
    for (a, _, slots), slot in zip(log, new, strict=True):
        usage[a.team] = usage.get(a.team, 0.0) - group_fraction(slots) + group_fraction((slot,))
    if any(usage.get(a.team, 0.0) > t.caps[a.team][1] + EPS for a, _, _ in log):
        return log
    for _a, owner, slots in reversed(log):
        for slot in reversed(slots):
            t.inv.release(slot, owner)
    out: list[Placed] = []
    for (a, owner, _), slot in zip(log, new, strict=True):
        assert slot is not None
        allocate_group(t.inv, (slot,), owner, model=a.model)
        out.append((a, owner, (slot,)))
    t.usage = usage
    return out
