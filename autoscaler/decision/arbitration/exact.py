"""The asks served in order, placed exactly on small MIG clusters (issue 19): again when that uses fewer GPUs,
or instead when the packer's one-at-a-time placement does not fit them all.

The in-order path places one replica at a time with the packer, which on a handful of MIG GPUs often opens one GPU
more than the batch needs (one GPU is +11-20% there), or finds no room for the last replicas of a batch that a
better layout fits. When every replica is one MIG-capable pod of a known memory size, the batch is handed to
:func:`sharing.mig_exact.place_batch_exact` (the per-device MILP within ``budget_s``, every running replica and lent
GPU fixed where it is). The MILP knows no slot speeds, so its placement is taken only if every model gets at least
the capacity (in the replicas its policy sized for, ``Ask.speed``) it needs:

- :func:`reseat_exact`: after the packer placed everything, the MILP's placement replaces it only when it breaks
  no more spreads and uses strictly fewer GPUs;
- :func:`place_all_exact`: after the packer found no room for everything, the MILP's placement is taken when it
  places every replica; else the ranked path decides who gets what, as before.

Either way no team may pass its limit with the slots it gets (a MIG slice is charged by its size, so the
GPU-equivalents a team holds can change), or nothing changes. The MIG layout actions
(:func:`autoscaler.decision.node_actions.mig_layout_actions`, what the live controller and the simulator carry
out) follow the placements, so the layout that is created is the one the MILP chose.

The cost is paid only on clusters of at most ``DEFAULT_MAX_DEVICES`` (16) MIG-enabled GPUs, or of any size with
nothing on them yet (the controller's first tick on a new cluster: the layout-count model), on ticks whose in-order
placement opens a GPU or does not fit. Each solve is bounded by its work limit (a HiGHS node limit: the same
snapshot gets the same plan on any machine) and the whole by ``budget_s`` of wall clock, a safety cut that is
counted when it fires (``ArbitrationResult.exact_budget_exceeded``, ``Plan.exact_budget_exceeded``).
"""

from __future__ import annotations

import math

from autoscaler.decision.arbitration.damage import EPS
from autoscaler.decision.arbitration.ordering import Progress
from autoscaler.decision.arbitration.tick import Tick
from autoscaler.decision.arbitration.types import Ask, ask_fraction
from sharing.mig_exact import DEFAULT_MAX_DEVICES, BatchOutcome, place_batch_exact
from sharing.mig_exact_model import modelled, spread_violations
from sharing.packer import allocate_group, group_fraction
from sharing.slots import Inventory, Slot

Placed = tuple[Ask, str, tuple[Slot, ...]]  # an ask, the replica's owner id, its slots


def eligible(asks: list[Ask]) -> bool:
    """Asks whose replicas the exact placement can place: single pods, one MIG slot of a known size."""
    return bool(asks) and all(a.pods == 1 and modelled(a.request) for a in asks)


def may_apply(asks: list[Ask], budget_s: float) -> bool:
    """Whether the exact placement can apply to this tick's asks at all (those with replicas to place)."""
    return budget_s > 0 and eligible([a for a in asks if Progress(a, ask_fraction(a)).remaining() > 0])


def _units(asks: list[Ask], slots: list[Slot]) -> dict[str, float]:
    """Capacity per model of replicas on ``slots``, in the replicas its policy sized for (a slot of another speed
    counts for ``speed(slot)``): the MILP knows no speeds, so its placement must give every model as much."""
    out: dict[str, float] = {}
    for a, slot in zip(asks, slots, strict=True):
        out[a.model] = out.get(a.model, 0.0) + (1.0 if a.speed is None else a.speed(slot))
    return out


def _in_reach(t: Tick, gpus_in_use_before: int) -> bool:
    """Within the per-device MILP's size, or a cluster with nothing on it before this tick (a batch planned from
    scratch: the layout-count model, whose size does not grow with the cluster, places it)."""
    return gpus_in_use_before == 0 or sum(1 for d in t.inv.devices.values() if d.mig_enabled) <= DEFAULT_MAX_DEVICES


def reseat_exact(t: Tick, log: list[Placed], budget_s: float, gpus_in_use_before: int | None) -> list[Placed]:
    """``log`` (what the in-order path allocated on ``t.inv``, which had ``gpus_in_use_before`` GPUs in use before
    it; None: not counted, the exact placement does not apply), placed again by the exact batch placement when that
    uses fewer GPUs by the rules of the module docstring: ``t.inv`` and ``t.usage`` changed to match, and the new
    log returned; else ``log`` as it was and nothing changed."""
    if gpus_in_use_before is None or budget_s <= 0 or not eligible([a for a, _, _ in log]):
        return log
    if t.inv.gpus_in_use() <= gpus_in_use_before:
        return log  # the in-order placement opened no GPU, so none can be saved
    if not _in_reach(t, gpus_in_use_before):
        return log
    trial = t.inv.copy()
    for _a, owner, slots in reversed(log):
        for slot in reversed(slots):
            trial.release(slot, owner)
    asks = [a for a, _, _ in log]
    new = _exact_slots(t, trial, asks, [owner for _, owner, _ in log], budget_s)
    if new is None:
        return log
    node_level = bool(getattr(t.packer, "node_anti_affinity", True))
    models = {a.model: a.request for a in reversed(asks)}
    before = (spread_violations(t.inv, models, node_level), t.inv.gpus_in_use())
    after = (spread_violations(trial, models, node_level), trial.gpus_in_use())
    if not (after[0] <= before[0] and after[1] < before[1]):
        return log
    had = _units(asks, [slots[0] for _, _, slots in log])
    got = _units(asks, new)
    if any(got[m] < had[m] - EPS for m in had):
        return log  # a replica moved to a slower slot: the exact placement serves less
    usage = dict(t.usage)
    for (a, _, slots), slot in zip(log, new, strict=True):
        usage[a.team] = usage.get(a.team, 0.0) - group_fraction(slots) + group_fraction((slot,))
    if _over_limit(t, asks, usage):
        return log
    for _a, owner, slots in reversed(log):
        for slot in reversed(slots):
            t.inv.release(slot, owner)
    return _commit(t, asks, [owner for _, owner, _ in log], new, usage)


def place_all_exact(t: Tick, asks: list[Ask], budget_s: float) -> list[Placed] | None:
    """Every ask's replicas placed exactly on ``t.inv`` (as it was before the in-order path tried, whose packer
    did not fit them all): allocated under ``t.name_replica`` ids and returned, when the MILP places every one
    within the teams' limits; else None and nothing changed (the ranked path takes over)."""
    if budget_s <= 0 or not eligible(asks) or not _in_reach(t, t.inv.gpus_in_use()):
        return None
    wanted = [a for a in asks for _ in range(Progress(a, ask_fraction(a)).remaining())]
    if not wanted:
        return None
    trial = t.inv.copy()
    new = _exact_slots(t, trial, wanted, [f"{a.model}/(exact-{i})" for i, a in enumerate(wanted)], budget_s)
    if new is None:
        return None
    got = _units(wanted, new)
    if any(math.ceil(a.wanted - got[a.model] - EPS) > 0 for a in asks if a.model in got):
        return None  # slower slots than sized for: the ranked path says so
    usage = dict(t.usage)
    for a, slot in zip(wanted, new, strict=True):
        usage[a.team] = usage.get(a.team, 0.0) + group_fraction((slot,))
    if _over_limit(t, wanted, usage):
        return None
    return _commit(t, wanted, [t.name_replica(a.model) for a in wanted], new, usage)


def _exact_slots(t: Tick, trial: Inventory, asks: list[Ask], owners: list[str], budget_s: float) -> list[Slot] | None:
    """One slot per ask (a replica each) placed on ``trial`` (changed) by the exact batch placement; None when the
    MILP's placement was not the one kept or left a replica out."""
    outcome: list[BatchOutcome] = []
    slots = place_batch_exact(t.packer, trial, [a.request for a in asks], budget_s, owners, outcome=outcome)
    if outcome[0].budget_exceeded:
        t.result.exact_budget_exceeded += 1  # (reported: this tick's plan may differ on another machine)
    if outcome[0].used != "exact" or any(s is None for s in slots):
        return None
    return [s for s in slots if s is not None]


def _over_limit(t: Tick, asks: list[Ask], usage: dict[str, float]) -> bool:
    return any(usage.get(a.team, 0.0) > t.caps[a.team][1] + EPS for a in asks)


def _commit(t: Tick, asks: list[Ask], owners: list[str], slots: list[Slot], usage: dict[str, float]) -> list[Placed]:
    """Allocate each ask's replica on its slot in ``t.inv`` under its owner; ``usage`` is the teams' usage then."""
    out: list[Placed] = []
    for a, owner, slot in zip(asks, owners, slots, strict=True):
        allocate_group(t.inv, (slot,), owner, model=a.model)
        out.append((a, owner, (slot,)))
    t.usage = usage
    return out
