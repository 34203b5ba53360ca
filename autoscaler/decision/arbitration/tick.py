"""One tick of arbitration: the inventory being filled, each team's usage against its (guarantee, limit), the
views preemption needs (built on first use), the capacity being freed, and the result being written -- with the
two ways an ask's replica ends without a placement now: refused, or granted on capacity being freed."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from autoscaler.api.plan import Shortfall, ShortfallCause
from autoscaler.decision.arbitration.damage import EPS
from autoscaler.decision.arbitration.ordering import Progress, rank_key
from autoscaler.decision.arbitration.policy import ArbitrationPolicy
from autoscaler.decision.arbitration.types import (
    ArbitrationResult,
    ArbitrationState,
    Ask,
    Candidate,
    ModelLoad,
    Views,
)
from sharing.lending import LENT_MODEL
from sharing.packer import Packer, group_fraction, place_group, release_held
from sharing.slots import Inventory, Slot


class Tick:
    """The working state of one :func:`~autoscaler.decision.arbitration.arbitrate` call."""

    def __init__(self, inventory: Inventory, packer: Packer, policy: ArbitrationPolicy, now: float,
                 team_of: Mapping[str, str], held: Mapping[str, float], views: Views,
                 freeing: list[tuple[str, Slot]], state: ArbitrationState,
                 name_replica: Callable[[str], str]) -> None:
        self.inv = inventory
        self.packer = packer
        self.policy = policy
        self.now = now
        self.team_of = team_of
        self._views = views
        self._loads: Mapping[str, ModelLoad] | None = None
        self._candidates: list[Candidate] | None = None
        self.delta: dict[str, int] = {}  # replicas placed (+) and preempted (-) this tick, per model
        self.freeing = freeing
        self.state = state
        self.name_replica = name_replica
        self.result = ArbitrationResult()
        self.future: Inventory | None = None  # capacity once what is being freed is free (built on first need)
        self.unplaceable: set[tuple] = set()  # request shapes that failed on ``inv`` (free capacity only shrinks)
        self.budget = policy.max_preemptions_per_tick
        # GPUs a waiting grant counts on (being freed for it): an ask ranked after it may not take them, or the
        # capacity a preemption freed would go to the next small ask and the preemption would repeat.
        self.claimed: set[tuple[str, int]] = set()
        self.held = held
        self.usage = dict(held)  # GPU-equivalents per team, not counting what is being freed
        self.caps = self._caps()

    # -- the views preemption needs, built on first use ----------------------------------------------------
    @property
    def loads(self) -> Mapping[str, ModelLoad]:
        if self._loads is None:
            self._loads, self._candidates = self._views()
        return self._loads

    @property
    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            self._loads, self._candidates = self._views()
        return self._candidates

    def n_active(self, model: str) -> int:
        """The model's replicas after this tick's placements and preemptions so far."""
        return self.loads[model].active + self.delta.get(model, 0)

    def place(self, inv: Inventory, a: Ask) -> tuple[Slot, ...] | None:
        """The slots of the ask's next replica on ``inv`` (not changed): one slot, or every pod's of a group, all or
        none (:func:`sharing.packer.place_group`)."""
        return place_group(self.packer, inv, a.request, a.pods)

    def future_view(self) -> Inventory:
        """The inventory once what is being freed is free: the replicas being removed or drained, and every lent
        training GPU (lent training is always reclaimed before any inference is preempted)."""
        if self.future is None:
            fut = self.inv.copy()
            for owner, slot in self.freeing:
                release_held(fut, slot, owner)
            for owner, slot in list(fut.allocations()):
                if fut.model_of(owner) == LENT_MODEL:
                    fut.release(slot, owner)
            self.future = fut
        return self.future

    # -- quotas ---------------------------------------------------------------------------------------
    def _caps(self) -> dict[str, tuple[float, float]]:
        """(guarantee, limit) per team. Partition mode: the listed guarantees scaled to the cluster are hard
        limits (a team not listed has no partition)."""
        teams = set(self.team_of.values()) | {t.name for t in self.policy.teams}
        if self.policy.mode != "partition":
            return {t: (q.guaranteed_gpus, q.limit_gpus) for t in teams for q in (self.policy.quota(t),)}
        total = sum(t.guaranteed_gpus for t in self.policy.teams)
        scale = self.inv.gpus_total / total if total > 0 else 0.0
        out = {}
        for t in teams:
            share = self.policy.quota(t).guaranteed_gpus * scale
            out[t] = (share, share)
        return out

    def within_guarantee(self, team: str, frac: float) -> bool:
        return self.usage.get(team, 0.0) + frac <= self.caps[team][0] + EPS

    def over_limit(self, team: str, frac: float) -> bool:
        return self.usage.get(team, 0.0) + frac > self.caps[team][1] + EPS

    def key(self, p: Progress) -> tuple:
        """The ask's rank now (:func:`~autoscaler.decision.arbitration.ordering.rank_key`)."""
        a = p.ask
        return rank_key(p, self.policy.mode, self.within_guarantee(a.team, p.frac),
                        self.state.borrowed.get(a.team, 0.0))

    # -- the ways an ask's replica ends without a placement now ----------------------------------------
    def refuse(self, p: Progress, cause: ShortfallCause, why: str) -> None:
        """The ask gets nothing more this tick: its remaining replicas are one shortfall, with ``why``."""
        missing = p.remaining()
        p.done = True
        if missing <= 0:
            return
        a = p.ask
        self.result.shortfalls.append(Shortfall(a.model, missing, why, cause, a.team,
                                                self.within_guarantee(a.team, p.frac)))

    def grant_waiting(self, p: Progress, slots: tuple[Slot, ...], cause: ShortfallCause, why: str) -> None:
        """The ask's next replica is granted ``slots`` (one, or every pod's of a group) on capacity being freed:
        claimed in the future view, and a shortfall of one replica until that capacity is free."""
        a = p.ask
        assert self.future is not None
        owner = f"{a.model}/(waiting-{len(self.result.shortfalls)}-{p.waiting})"
        for slot in slots:
            self.future.allocate(slot, owner, model=a.model)
            self.claimed.update((slot.node, i) for i in slot.devices)
        frac = group_fraction(slots)
        self.usage[a.team] = self.usage.get(a.team, 0.0) + frac
        p.waiting += 1
        p.frac = frac
        within = self.within_guarantee(a.team, 0.0)
        self.result.shortfalls.append(Shortfall(a.model, 1, why, cause, a.team, within))
