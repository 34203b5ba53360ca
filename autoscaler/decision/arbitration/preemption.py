"""Preemption, only to fix an SLO miss: which running replicas an ask may drain (and why), the least harmful set
of them that frees a slot it fits, whether the preemptor gains more than the victims lose, and the removals."""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscaler.api.plan import PreemptionReason, RemoveReplica, ShortfallCause
from autoscaler.decision.arbitration.damage import EPS, replica_loss, spare, weight
from autoscaler.decision.arbitration.ordering import Progress, gain_expected, misses, would_miss
from autoscaler.decision.arbitration.tick import Tick
from autoscaler.decision.arbitration.types import Ask, Candidate
from sharing.packer import allocate_group, fits_group, place_group, release_held
from sharing.slots import Inventory, Slot, SlotRequest

MAX_VICTIM_TRIALS = 48  # victims tried per preemption (each is one packer call on a trial inventory)
MAX_DEVICE_TRIALS = 8  # devices tried per preemption when clearing whole devices

Victim = tuple[Candidate, PreemptionReason]
# (total loss, victims, the slots freed -- one, or every pod's of a group --, the victims it needs): the cheaper
# search result wins
Option = tuple[float, int, tuple[Slot, ...], list[Victim]]


def preempt_for(t: Tick, p: Progress) -> None:
    """Free a slot for the ask's next replica by preempting replicas ranked below it, or refuse it (saying why).
    The slot is granted on the capacity being freed (the victims drain)."""
    a = p.ask
    policy = t.policy
    if not policy.preemption or policy.mode == "partition":
        t.refuse(p, ShortfallCause.UNPLACEABLE, "no free GPU slot fits the replica")
        return
    within = t.within_guarantee(a.team, p.frac)
    # A miss at the expected load may cost others SLO; a miss only at the forecast's tail may take only
    # replicas that are spare for their own model (no SLO damage at its expected load).
    certain = policy.mode == "priority" or would_miss(p)
    miss = certain or misses(p)
    eligible, lower, young = _eligible(t, a, within, miss)
    if not eligible:
        if lower and not miss:
            t.refuse(p, ShortfallCause.HEADROOM, "the model meets its SLO without it: nothing is preempted "
                                                 "for headroom, and no free GPU slot fits the replica")
        elif young:
            t.refuse(p, ShortfallCause.MIN_RUNTIME, f"the lower-ranked replicas it could preempt have run "
                                                    f"less than {policy.min_runtime_s:g} s")
        else:
            t.refuse(p, ShortfallCause.UNPLACEABLE, "no free GPU slot fits the replica and nothing ranked "
                                                    "below it holds GPUs it may preempt")
        return
    if t.budget <= 0:
        t.refuse(p, ShortfallCause.OUTRANKED, f"the {policy.max_preemptions_per_tick} preemptions of this "
                                              "tick went to models ranked ahead")
        return
    found = choose_victims(t, a.request, eligible, certain, a.pods)
    if found is None:
        if certain:
            t.refuse(p, ShortfallCause.UNPLACEABLE, "no free GPU slot fits the replica, even after "
                                                    "preempting every replica it may")
        else:
            t.refuse(p, ShortfallCause.HEADROOM, "it would miss its SLO only at the forecast's upper "
                                                 "quantile, and no lower-ranked replica is spare enough "
                                                 "to preempt for that")
        return
    slots, needed = found
    if policy.mode == "slo" and certain and not within:
        gain = weight(a.priority) * gain_expected(p)
        loss = _set_loss(t, needed, weighted=True)
        if gain < loss - EPS:
            t.refuse(p, ShortfallCause.DAMAGE, f"preempting would cost the victims more of their SLO than it "
                                               f"brings (priority-weighted {loss:.3g} > {gain:.3g})")
            return
    if len(needed) > t.budget:
        t.refuse(p, ShortfallCause.OUTRANKED, f"it needs {len(needed)} preemptions; {t.budget} are left "
                                              "this tick")
        return
    _preempt(t, p, slots, needed)


def _eligible(t: Tick, a: Ask, within: bool, miss: bool) -> tuple[list[Victim], bool, bool]:
    """The replicas the ask may preempt, each with its reason; whether lower-ranked replicas exist at all; whether
    some were left out for being younger than ``min_runtime_s``. Nothing is eligible without a ``miss``."""
    eligible: list[Victim] = []
    lower = young = False  # lower-ranked replicas exist / some are too young to preempt
    for c in t.candidates:
        if c.model == a.model or t.n_active(c.model) <= t.loads[c.model].min_replicas:
            continue
        if t.usage.get(c.team, 0.0) - c.gpu_fraction < t.caps[c.team][0] - EPS:
            continue  # never below the victim team's guarantee
        if within and c.team != a.team:
            reason = PreemptionReason.GUARANTEE
        elif c.priority < a.priority:
            reason = PreemptionReason.PRIORITY
        else:
            continue
        lower = True
        if not miss:
            continue
        if reason is not PreemptionReason.GUARANTEE and t.now - c.started_at < t.policy.min_runtime_s:
            young = True
            continue
        eligible.append((c, reason))
    return eligible, lower, young


def _preempt(t: Tick, p: Progress, slots: tuple[Slot, ...], needed: list[Victim]) -> None:
    """Remove the victims (each with its reason, a group with all its pods) and grant the ask ``slots`` on the
    capacity they free."""
    a = p.ask
    future = t.future_view()
    for c, reason in needed:
        _release(future, c)
        t.candidates.remove(c)
        t.usage[c.team] = t.usage.get(c.team, 0.0) - c.gpu_fraction
        t.delta[c.model] = t.delta.get(c.model, 0) - 1
        t.budget -= 1
        if reason is PreemptionReason.GUARANTEE:
            why = f"team {a.team} is inside its guarantee and team {c.team} is borrowing"
        else:
            why = f"priority {a.priority} > {c.priority} and {a.model} would miss its SLO"
        t.result.preemptions.append(RemoveReplica(
            c.model, c.replica_id, preempted_by=a.model, reason=reason,
            message=f"replica {c.replica_id} of {c.model} (team {c.team}) preempted for {a.model} "
                    f"(team {a.team}): {why}"))
    t.grant_waiting(p, slots, ShortfallCause.PREEMPTING,
                    f"preempted {len(needed)} replica(s) of lower rank; waiting for them to drain")


# -- what a victim costs -------------------------------------------------------------------------------------

@dataclass
class _Taken:
    """Victims chosen so far in one search: replicas per model, GPU-equivalents per team."""

    models: dict[str, int] = field(default_factory=dict)
    teams: dict[str, float] = field(default_factory=dict)

    def add(self, c: Candidate) -> None:
        self.models[c.model] = self.models.get(c.model, 0) + 1
        self.teams[c.team] = self.teams.get(c.team, 0.0) + c.gpu_fraction


def _loss(t: Tick, c: Candidate, taken: int) -> float:
    """What taking one more replica of ``c``'s model (after ``taken``) costs (:func:`replica_loss`). Without SLO
    knowledge (the priority baseline): 0."""
    if t.policy.mode != "slo":
        return 0.0
    return replica_loss(t.loads[c.model], t.n_active(c.model) - taken, c.gpu_fraction)


def _spare(t: Tick, c: Candidate, taken: int) -> bool:
    """``c``'s model still meets its SLO without one more replica (after ``taken``) even at the load it was
    sized for (its forecast's upper quantile): what a model that would miss only at its own forecast's tail
    may take. (Judged at the victim's expected load instead, a victim on the edge misses a tick later and
    preempts further down in turn.)"""
    if t.policy.mode != "slo":
        return False
    return spare(t.loads[c.model], t.n_active(c.model) - taken)


def _set_loss(t: Tick, victims: list[Victim], weighted: bool = False) -> float:
    """The shares of their models' requests the victims take out of the SLO together (optionally weighted by
    their priority)."""
    taken: dict[str, int] = {}
    total = 0.0
    for c, _ in victims:
        w = weight(c.priority) if weighted else 1.0
        total += w * _loss(t, c, taken.get(c.model, 0)) * c.gpu_fraction
        taken[c.model] = taken.get(c.model, 0) + 1
    return total


def _allowed(t: Tick, c: Candidate, took: _Taken, certain: bool) -> bool:
    """With the victims ``took`` already holds: never a model below its floor nor a team below its guarantee;
    a victim whose model would then miss its SLO only for a certain miss."""
    ld = t.loads[c.model]
    taken = took.models.get(c.model, 0)
    if t.n_active(c.model) - taken - 1 < ld.min_replicas:
        return False
    left = t.usage.get(c.team, 0.0) - took.teams.get(c.team, 0.0) - c.gpu_fraction
    if left < t.caps[c.team][0] - EPS:
        return False
    return certain or _spare(t, c, taken)


# -- choosing victims ----------------------------------------------------------------------------------------

def _release(inv: Inventory, c: Candidate) -> None:
    """Free every slot of the victim ``c`` in ``inv`` (a group replica: all its pods')."""
    for s in c.slots:
        release_held(inv, s, c.replica_id)


def _touches(c: Candidate, devices: set[tuple[str, int]]) -> bool:
    return any((s.node, i) in devices for s in c.slots for i in s.devices)


def choose_victims(t: Tick, req: SlotRequest, eligible: list[Victim],
                   certain: bool, pods: int = 1) -> tuple[tuple[Slot, ...], list[Victim]] | None:
    """The slots (one, or ``pods`` of a group, placed together) and the least harmful set of victims that frees
    them, or None. Two searches, the cheaper kept:
    replica by replica, least harm first (a model's next replica costs more than its last, so one model is
    not emptied while others lose nothing), which suits a small slot; and device by device, the device whose
    victims cost least in total first, which suits a whole GPU on a device shared by many small replicas. The
    set is then trimmed: a victim the slot does not need after all stays."""
    future = t.future_view()
    options = [o for o in (_by_replica(t, future, req, eligible, certain, pods),
                           _by_device(t, future, req, eligible, certain, pods)) if o is not None]
    if not options:
        return None
    _, _, slots, needed = min(options, key=lambda o: (o[0], o[1]))
    return slots, _trim(t, future, slots, needed)


def _option(t: Tick, slots: tuple[Slot, ...], released: list[Victim]) -> Option:
    """The search result: the victims released that share a device with ``slots``, and their loss."""
    touched = {(s.node, i) for s in slots for i in s.devices}
    needed = [(c, r) for c, r in released if _touches(c, touched)]
    return (_set_loss(t, needed), len(needed), slots, needed)


def _by_replica(t: Tick, future: Inventory, req: SlotRequest, eligible: list[Victim],
                certain: bool, pods: int = 1) -> Option | None:
    """Release the least harmful allowed victim, one at a time, until the request fits."""
    trial = future.copy()
    took = _Taken()
    released: list[Victim] = []
    pool = list(eligible)
    while pool and len(released) < MAX_VICTIM_TRIALS:
        best, best_key = -1, None
        for k, (c, r) in enumerate(pool):
            if not _allowed(t, c, took, certain):
                continue
            loss = _loss(t, c, took.models.get(c.model, 0))
            key = (0 if r is PreemptionReason.GUARANTEE else 1, loss, c.priority, -c.started_at)
            if best_key is None or key < best_key:
                best, best_key = k, key
        if best < 0:
            break
        c, r = pool.pop(best)
        took.add(c)
        _release(trial, c)
        released.append((c, r))
        slots = place_group(t.packer, trial, req, pods)
        if slots is not None:
            return _option(t, slots, released)
    return None


def _by_device(t: Tick, future: Inventory, req: SlotRequest, eligible: list[Victim],
               certain: bool, pods: int = 1) -> Option | None:
    """Clear whole devices, the cheapest device (all its victims allowed) first, until the request fits there."""
    by_device: dict[tuple[str, tuple[int, ...]], list[Victim]] = {}
    for c, r in eligible:
        by_device.setdefault((c.slot.node, c.slot.devices), []).append((c, r))
    groups = []
    for members in by_device.values():
        group = _Taken()
        ok = True
        for c, _ in members:
            if not _allowed(t, c, group, certain):
                ok = False
                break
            group.add(c)
        if ok:
            groups.append((_set_loss(t, members), len(members), members))
    groups.sort(key=lambda g: (g[0], g[1]))
    for _, _, members in groups[:MAX_DEVICE_TRIALS]:
        trial = future.copy()
        for c, _ in members:
            _release(trial, c)
        slots = place_group(t.packer, trial, req, pods)
        lead = members[0][0].slot
        if slots is not None and any(s.node == lead.node and set(s.devices) & set(lead.devices) for s in slots):
            return _option(t, slots, members)
    return None


def _trim(t: Tick, future: Inventory, slots: tuple[Slot, ...], needed: list[Victim]) -> list[Victim]:
    """Put back every victim the slots still fit without, the most harmful first; the victims left."""
    trial = future.copy()
    for c, _ in needed:
        _release(trial, c)
    kept = []
    for c, r in sorted(needed, key=lambda v: -_loss(t, v[0], 0)):
        if fits_group(trial, c.slots):
            allocate_group(trial, c.slots, c.replica_id, model=c.model)
            if fits_group(trial, slots):
                continue
            for s in c.slots:
                trial.release(s, c.replica_id)
        kept.append((c, r))
    return kept

