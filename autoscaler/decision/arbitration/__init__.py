"""Arbitration among models when GPUs run out: team quotas, priorities and SLO damage (issue 9).

The decision core sizes every model first (the policy, inside its rails); the replicas asked for beyond the
current ones are *asks*. When they do not all fit, :func:`arbitrate` decides who gets the GPUs, one replica at a
time, and who is preempted, and says why for every replica refused. Pure: no I/O, no clock.

The rules (``mode="slo"``, the default). A model's SLO is judged with the queueing model of
:mod:`autoscaler.estimation.capacity` (attainment: the share of its requests within the SLO latency) at two loads:
the load its
policy sized for (the forecast's upper quantile: its *tail*) and the load it expects (the forecast's median, at least
what it observes now). Values are shares of a model's requests, so every model counts the same, as in the summed SLO
attainment a platform is judged by.

1. **Guarantee first.** A replica that keeps its team inside its guaranteed GPUs (GPU-equivalents: a slot counts
   by its GPU fraction) is served before any replica that borrows. A team never holds more than its guarantee +
   borrowing limit (``borrowing_limit``).
2. **Then what fixes an SLO miss.** Among the rest, a replica without which the model would miss its SLO at its
   tail is served before headroom, by priority, then by **SLO damage per GPU**: the share of the model's requests
   the replicas still to come bring inside the SLO, averaged over them, per GPU-equivalent (the model that would
   miss worst, per GPU it costs, first), then the team that borrowed least lately (fair between equal teams over
   time).
3. **Capacity being freed before new preemptions.** An ask that does not fit now but fits on GPUs already being
   freed (replicas draining, lent training GPUs) waits for them: on lent GPUs the lend stage reclaims them
   (``reclaiming``); lent training is always reclaimed before any inference is preempted. The GPUs a waiting ask
   counts on are claimed: an ask ranked after it may not take them (``outranked``).
4. **Preemption, only to fix an SLO miss.** It may drain replicas of models of strictly lower priority
   (``priority``), or, inside its team's guarantee, replicas of teams above their guarantee (``guarantee``, at
   once: borrowed capacity is lent on that condition), never a victim's team below its guarantee nor a model
   below its floor, priority victims only after ``min_runtime_s``, at most ``max_preemptions_per_tick``. A model
   that would miss at its *expected* load may take any such replica, the least harm first (replica by replica or
   a whole shared device, whichever costs less, then trimmed to what the slot needs), unless the victims lose more
   than it gains, each model weighted by 1 + its priority (``damage``). A model that would miss only at its
   *tail* may take only replicas their own model can spare even at its tail (``headroom`` otherwise): so a victim
   does not miss a tick later and preempt further down in turn. Nothing is preempted for headroom. No flapping: a
   victim's model ranks below its preemptor by the same rules next tick.

A replica that is a group of pods (``Ask.pods``, a LeaderWorkerSet replica) is one replica in every rule above: its
slots are placed together or not at all (:func:`sharing.packer.place_group`), it counts all its pods' GPUs against
its team, and as a victim it frees all of them.

Baselines, for the benchmark: ``mode="priority"`` (Kueue/KAI-style: the same quotas, then priority and arrival
order, preempting lower priority for any ask, with no SLO knowledge) and ``mode="partition"`` (static per-team
partitions: each team's guarantee, scaled to the cluster, is its hard limit; no borrowing, no preemption).

The modules, one idea each (imports point down this list): :mod:`.types` (the data in and out),
:mod:`.policy` (the settings: modes, team quotas), :mod:`.damage` (the SLO arithmetic), :mod:`.ordering` (an ask's
progress and rank), :mod:`.tick` (one tick's working state: quotas, refusals, waiting grants), :mod:`.preemption`
(whom to preempt, rule 4), :mod:`.loop` (:func:`arbitrate`).
"""

from autoscaler.decision.arbitration.loop import arbitrate
from autoscaler.decision.arbitration.policy import ARBITRATION_MODES, ArbitrationPolicy, TeamQuota
from autoscaler.decision.arbitration.types import (
    ArbitrationResult,
    ArbitrationState,
    Ask,
    Candidate,
    LazyMapping,
    ModelLoad,
    held_by_team,
    request_fraction,
)

__all__ = [
    "ARBITRATION_MODES",
    "ArbitrationPolicy",
    "ArbitrationResult",
    "ArbitrationState",
    "Ask",
    "Candidate",
    "LazyMapping",
    "ModelLoad",
    "TeamQuota",
    "arbitrate",
    "held_by_team",
    "request_fraction",
]
