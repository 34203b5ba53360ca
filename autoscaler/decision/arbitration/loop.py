"""The arbitrate loop: every ask served in order when all fit; else one replica at a time to the ask ranked first
(placed now, granted on capacity being freed, preempted for, or refused), re-ranked as teams fill their quotas;
and the fairness memory updated before each tick."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping

from autoscaler.api.plan import Shortfall, ShortfallCause
from autoscaler.decision.arbitration.damage import EPS
from autoscaler.decision.arbitration.exact import Placed, may_apply, place_all_exact, reseat_exact
from autoscaler.decision.arbitration.ordering import Progress
from autoscaler.decision.arbitration.policy import ArbitrationPolicy
from autoscaler.decision.arbitration.preemption import preempt_for
from autoscaler.decision.arbitration.tick import Tick
from autoscaler.decision.arbitration.types import ArbitrationResult, ArbitrationState, Ask, Views, ask_fraction
from sharing.lending import LENT_MODEL
from sharing.packer import Packer, allocate_group, fits_group, group_fraction
from sharing.slots import Inventory, Slot


def arbitrate(
    asks: list[Ask],
    inventory: Inventory,
    packer: Packer,
    policy: ArbitrationPolicy,
    now: float,
    *,
    exact_budget_s: float = 0.0,
    team_of: Mapping[str, str],
    held: Mapping[str, float],
    views: Views,
    freeing: list[tuple[str, Slot]],
    state: ArbitrationState,
    name_replica: Callable[[str], str],
) -> ArbitrationResult:
    """Serve ``asks`` on ``inventory`` (changed: each placed replica is allocated there under the id
    ``name_replica(model)`` gives, every slot of a replica that is a group of pods under that one id) by the rules
    of the package docstring.

    ``team_of``: every valid model's team; ``held``: GPU-equivalents per team held by replicas not being freed
    (:func:`held_by_team` of the candidates); ``views()``: every valid model's damage inputs (``ModelLoad``) and
    the running replicas that may be preempted (not draining, not being removed this tick), asked for only when
    the asks do not all fit; ``freeing``: (owner, slot) of replicas being removed or drained (their capacity is
    coming free); ``state``: the fairness memory (updated); ``exact_budget_s``: the time the in-order path may
    spend placing its batch again exactly (:mod:`~autoscaler.decision.arbitration.exact`; 0: never)."""
    _remember_borrowing(state, held, policy, now)
    t = Tick(inventory, packer, policy, now, team_of, held, views, freeing, state, name_replica)
    # The tick's asks count in the CPU/memory per GPU a host-aware packer learns (sharing/host_resources.py): each
    # model's replicas after the tick (its current ones and the new ones; the packer counts those not yet held). It
    # reserves nothing, and is cleared after the tick so no other caller sees this tick's asks. Only an inventory
    # that accounts host capacity has the tie-break at all (CostAwarePacker._host_view): else nothing is built.
    announce = getattr(packer, "host_workload", None) if inventory.host_accounted else None
    if announce is not None:
        announce([a.request for a in asks for _ in range(a.current + Progress(a, ask_fraction(a)).remaining())])
    try:
        if not _serve_in_order(t, asks, exact_budget_s):
            _ranked(t, asks)
    finally:
        if announce is not None:
            announce(None)
    for team in t.caps:
        t.result.team_gpus[team] = t.usage.get(team, 0.0)
    return t.result


def _serve_in_order(t: Tick, asks: list[Ask], exact_budget_s: float) -> bool:
    """Every ask in full, in the order given, or nothing (False, the inventory as it was): when all fit, the
    order does not matter and no ranking is paid for (most ticks of a cluster that is not full). On a small MIG
    cluster the batch is then placed again exactly when that saves a GPU, or placed exactly when the packer's
    one-at-a-time placement does not fit it all (:mod:`~autoscaler.decision.arbitration.exact`)."""
    # Counting the GPUs in use walks every device: only when the exact placement can apply.
    gpus_before = t.inv.gpus_in_use() if may_apply(asks, exact_budget_s) else None
    log, stop = _place_in_order(t, asks)
    if stop is None:
        log = reseat_exact(t, log, exact_budget_s, gpus_before)
    else:
        for _a, owner, slots in reversed(log):
            for slot in reversed(slots):
                t.inv.release(slot, owner)
        t.usage = dict(t.held)
        # Only a batch the packer found no room for can be placed exactly (not a team at its limit, not slots
        # slower than sized for): on those ticks the solve would be thrown away.
        exact = place_all_exact(t, asks, exact_budget_s) if stop == "no room" else None
        if exact is None:
            return False
        log = exact
    for a, owner, slots in log:
        _record_placed(t, a.model, owner, slots)
    return True


def _place_in_order(t: Tick, asks: list[Ask]) -> tuple[list[Placed], str | None]:
    """Each ask's replicas placed and allocated one at a time with the packer, in order, until one does not fit,
    would pass its team's limit, or the ask's replicas are too slow: what was allocated, and why it stopped (None:
    every ask got all it asked for; "no room", "limit", "slow")."""
    log: list[Placed] = []
    for a in asks:
        p = Progress(a, ask_fraction(a))
        while p.remaining() > 0:
            slots = t.place(t.inv, a)
            if slots is None:
                return log, "no room"
            if t.over_limit(a.team, group_fraction(slots)):
                return log, "limit"
            owner = t.name_replica(a.model)
            allocate_group(t.inv, slots, owner, model=a.model)
            t.usage[a.team] = t.usage.get(a.team, 0.0) + group_fraction(slots)
            log.append((a, owner, slots))
            p.placed += 1
            p.units += 1.0 if a.speed is None else a.speed(slots[0])
        if math.ceil(a.wanted - p.units - EPS) > 0:
            return log, "slow"  # slower slots and max replicas reached: say so on the ranked path
    return log, None


def _record_placed(t: Tick, model: str, owner: str, slots: tuple[Slot, ...]) -> None:
    """The result's entry of a placed replica: its (leader's) slot, and a group's other pods' slots."""
    t.result.placed.setdefault(model, []).append((owner, slots[0]))
    if len(slots) > 1:
        t.result.group_slots[owner] = slots[1:]


def _ranked(t: Tick, asks: list[Ask]) -> None:
    """One replica at a time to the ask ranked first, until every ask is served or refused."""
    heap: list[tuple[tuple, int, Progress]] = []
    progress = [Progress(a, ask_fraction(a)) for a in asks]
    for i, p in enumerate(progress):
        if p.remaining() > 0:
            heapq.heappush(heap, (t.key(p), i, p))
    while heap:
        key, i, p = heapq.heappop(heap)
        fresh = t.key(p)
        if heap and fresh > key and fresh > heap[0][0]:
            heapq.heappush(heap, (fresh, i, p))  # its rank fell (its team passed its guarantee...)
            continue
        _step(t, p)
        if not p.done and p.remaining() > 0:
            heapq.heappush(heap, (t.key(p), i, p))
    for p in progress:
        a = p.ask
        short = math.ceil(a.wanted - p.units - p.waiting - EPS)
        if not p.done and short > 0:  # slower slots than it was sized for, and max replicas reached
            t.result.shortfalls.append(Shortfall(
                a.model, short, f"the slots it got are slower than those it was sized for, and its "
                                f"{a.current + a.max_new} max replicas are reached", ShortfallCause.MAX_REPLICAS,
                a.team, t.within_guarantee(a.team, 0.0)))


def _step(t: Tick, p: Progress) -> None:
    """The ask's next replica: placed on free capacity, else granted on capacity being freed, else preempted
    for (or refused)."""
    a = p.ask
    team = a.team
    if t.over_limit(team, p.frac):
        limit = t.caps[team][1]
        what = "partition" if t.policy.mode == "partition" else "guarantee + borrowing limit"
        t.refuse(p, ShortfallCause.BORROWING_LIMIT,
                 f"team {team} holds {t.usage.get(team, 0.0):.2f} GPUs of its {what} {limit:.2f}")
        return
    req = a.request
    shape = (req.memory_gib, req.compute_fraction, req.gpus, req.kinds, req.gpu_models, a.pods)
    slots = None if shape in t.unplaceable else t.place(t.inv, a)
    if slots is not None and t.claimed.intersection((s.node, i) for s in slots for i in s.devices):
        t.refuse(p, ShortfallCause.OUTRANKED, "the free GPU slot it fits is being freed for a model ranked ahead")
        return
    if slots is not None:
        _place(t, p, slots)
        return
    t.unplaceable.add(shape)
    slots = t.place(t.future_view(), a)
    if slots is not None:
        lent = any(t.inv.model_of(o) == LENT_MODEL for s in slots for i in s.devices
                   for o, _ in t.inv.device(s.node, i).entries)
        if lent:
            t.grant_waiting(p, slots, ShortfallCause.RECLAIMING, "lent training GPUs are being reclaimed for it")
        else:
            t.grant_waiting(p, slots, ShortfallCause.PREEMPTING, "waiting for replicas that are draining")
        return
    preempt_for(t, p)


def _place(t: Tick, p: Progress, slots: tuple[Slot, ...]) -> None:
    """Start the ask's next replica on the free ``slots`` (one, or every pod's of a group; unless it would pass the
    team's limit)."""
    a = p.ask
    team = a.team
    frac = group_fraction(slots)
    if t.over_limit(team, frac):
        t.refuse(p, ShortfallCause.BORROWING_LIMIT,
                 f"team {team} holds {t.usage.get(team, 0.0):.2f} GPUs; the slot found "
                 f"({frac:.2f}) would pass its limit {t.caps[team][1]:.2f}")
        return
    owner = t.name_replica(a.model)
    allocate_group(t.inv, slots, owner, model=a.model)
    # The future view keeps this tick's waiting grants; a placement now on a GPU one of them counts on
    # (a draining slice's neighbour) is left out of it: the grant is looked at again next tick anyway.
    if t.future is not None and fits_group(t.future, slots):
        allocate_group(t.future, slots, owner, model=a.model)
    _record_placed(t, a.model, owner, slots)
    t.usage[team] = t.usage.get(team, 0.0) + frac
    t.delta[a.model] = t.delta.get(a.model, 0) + 1
    p.placed += 1
    p.frac = frac
    p.units += 1.0 if a.speed is None else a.speed(slots[0])


def _remember_borrowing(state: ArbitrationState, held: Mapping[str, float], policy: ArbitrationPolicy,
                        now: float) -> None:
    """Decay each team's borrowed GPU-seconds and add what it borrows now (held above its guarantee)."""
    dt = 0.0 if state.at is None else max(0.0, now - state.at)
    state.at = now
    if dt <= 0:
        return
    half = policy.fairness_half_life_s
    decay = 0.5 ** (dt / half) if half > 0 else 0.0
    for team in set(state.borrowed) | set(held):
        over = max(0.0, held.get(team, 0.0) - policy.quota(team).guaranteed_gpus)
        value = state.borrowed.get(team, 0.0) * decay + over * dt
        if value > EPS:
            state.borrowed[team] = value
        else:
            state.borrowed.pop(team, None)
