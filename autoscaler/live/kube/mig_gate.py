"""The MIG re-layout safety gate: a per-node state machine that changes a node's MIG partitioning only when no
pod still uses a GPU instance that is about to disappear.

A ``SetMigLayout`` action starts one :class:`Relayout` per node; the actuator advances every relayout in flight
once per tick (:meth:`MigGate.tick`), so a relayout spans many ticks and lives as long as the actuator object
(the controller process). Phases::

    CORDON ──▶ WAIT_FREE ──▶ APPLY ──▶ WAIT_SUCCESS ──▶ UNCORDON ──▶ DONE
       (spec.unschedulable   (the node's pods fit      (mig-parted ConfigMap entry,   (label
        = true, unless an     ``action.busy``)          node label nvidia.com/         nvidia.com/mig.config.state
        admin already did)                              mig.config = config_name)      == success)
    WAIT_FREE / WAIT_SUCCESS timeout, state "failed", label changed by someone else ──▶ FAILED (uncordon if we
    cordoned, Warning Event)

Decisions live in pure functions (:func:`blocking_pods`, :func:`decide`) of (relayout, node as read, the node's
pods, now); :class:`MigGate` only runs the I/O they ask for, through the narrow :class:`GateIO` port the
actuator implements.

**Success detection.** ``nvidia.com/mig.config.state`` may still say ``success`` from the previous layout when we
relabel, so a plain "state == success" after the relabel could end the gate before the MIG manager even started.
The gate therefore writes ``nvidia.com/mig.config.state=pending`` IN THE SAME PATCH as the new
``nvidia.com/mig.config`` value: the two labels change atomically, so any ``success`` read afterwards was written
after our relabel, i.e. by the MIG manager for this config. (``pending`` is the value the MIG manager itself sets
when it picks up a new config, so this only makes its first step visible atomically; a manager that goes to
``success`` faster than one tick is still detected, which a "must see a non-success value first" rule would miss,
and unlike "the node's resourceVersion advanced" it cannot be fooled by unrelated node writes such as kubelet
heartbeats.) When the label already holds ``config_name`` the MIG manager will not react to a relabel (it watches
the label's value), so: if the ConfigMap entry is unchanged, the current state is about this very config and is
used as is; if the entry under that name changed, the relayout fails with that reason (config names must be
content-addressed).

**Cordon ownership.** When we cordon, the same patch sets the label ``slotwise.io/mig-relayout=<config name>``;
we uncordon only nodes we cordoned (an admin's cordon stays) and remove the label then. After a controller
restart the label lets the new process find its half-done relayouts (:meth:`MigGate.recover`): it waits for the
MIG manager when the relabel had happened and then uncordons, so a restart never leaves a node cordoned forever.

**Only from the node as it is, in this term.** Before each step the node is read fresh; a relayout whose node no
longer carries our owner label (another leader finished or rolled it back, or owns it now) is dropped without a
write, and the relabel and uncordon re-check the label in the same read that carries the ``resourceVersion``
precondition of their patch. When leadership is (re)gained :meth:`MigGate.new_term` forgets every relayout
remembered from an earlier term; the next tick adopts what the node labels say (:meth:`MigGate.recover`). With
re-layout switched off, adopted relayouts are still finished (wait for the MIG manager, then uncordon) or rolled
back (uncordon): that needs ``get`` and ``patch`` on nodes (and Events), whatever the switch says.

**Freshness of the pods.** ``view.nodes[node].gpu_pods`` comes from the informer cache; a pod bound just before
the cordon may not be in it yet. The tick that cordons therefore ends there: WAIT_FREE is first judged on the
next tick's view, read after the cordon was written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from autoscaler.api.plan import Plan, SetMigLayout
from autoscaler.live.kube.gpu_nodes import is_gpu_resource
from autoscaler.live.kube.objects import (
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    PREFIX,
    ClusterView,
)
from autoscaler.live.kube.term import LeadershipLost

log = logging.getLogger(__name__)

OWNER_LABEL = PREFIX + "mig-relayout"  # on a node we cordoned for a relayout: the config name being applied
STATE_PENDING = "pending"
STATE_SUCCESS = "success"
STATE_FAILED = "failed"


class Phase(StrEnum):
    CORDON = "cordon"
    WAIT_FREE = "wait-free"
    APPLY = "apply"
    WAIT_SUCCESS = "wait-success"
    UNCORDON = "uncordon"
    DONE = "done"
    FAILED = "failed"


class Op(StrEnum):
    """What :func:`decide` asks the gate to do now."""

    WAIT = "wait"  # nothing this tick
    CORDON = "cordon"
    APPLY = "apply"  # write the ConfigMap entry, relabel the node
    UNCORDON = "uncordon"  # success: uncordon (if ours) and finish
    FAIL = "fail"  # give up: uncordon (if ours), Warning Event
    GONE = "gone"  # the node was deleted: nothing left to undo
    DROP = "drop"  # an adopted relayout that is no longer ours (another process finished it): forget it


@dataclass(frozen=True)
class NodeRead:
    """The live Node as the gate needs it (read from the API server each tick, not from the cache)."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    resource_version: str = ""


@dataclass
class Relayout:
    """One node's relayout in flight."""

    node: str
    config_name: str
    config: dict
    busy: dict[str, int]
    changed: tuple[int, ...] = ()
    phase: Phase = Phase.CORDON
    started: float = 0.0
    phase_since: float = 0.0
    ticks_in_phase: int = 0  # ticks spent waiting in the phase (reporting)
    we_cordoned: bool = False
    owner: str = ""  # the OWNER_LABEL value we wrote when cordoning (a retarget keeps it): the node is ours iff
    #                  it still says so
    recovered: bool = False  # adopted after a restart (no action to compare against; config unknown)
    outcome: str = ""  # why it failed / how it ended

    def enter(self, phase: Phase, now: float) -> None:
        log.info("mig relayout %s (%s): %s -> %s", self.node, self.config_name, self.phase, phase)
        self.phase, self.phase_since, self.ticks_in_phase = phase, now, 0

    @property
    def active(self) -> bool:
        return self.phase not in (Phase.DONE, Phase.FAILED)


@dataclass(frozen=True)
class Step:
    op: Op
    why: str = ""


def blocking_pods(gpu_pods: Mapping[str, int], busy: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """GPU resources whose pods on the node exceed what may keep running through the change:
    ``resource -> (pods using it, allowed)``; empty when the node is free enough to re-partition.

    ``busy`` counts the pods on instances (or whole GPUs) that stay; every other pod on an ``nvidia.com/gpu`` or
    ``nvidia.com/mig-*`` resource might sit on a GPU that changes, and the action does not say which, so any
    count above ``busy`` blocks.
    """
    return {
        res: (n, busy.get(res, 0))
        for res, n in sorted(gpu_pods.items())
        if is_gpu_resource(res) and n > busy.get(res, 0)
    }


def decide(job: Relayout, node: NodeRead | None, gpu_pods: Mapping[str, int], now: float, timeout_s: float) -> Step:
    """The next step of ``job``, from the node as just read and its pods (pure)."""
    if node is None:
        return Step(Op.GONE, f"node {job.node} no longer exists")
    if job.recovered and node.labels.get(OWNER_LABEL) != job.config_name:
        return Step(Op.DROP, "the node no longer carries our relayout label")
    if job.we_cordoned and job.phase is not Phase.CORDON and node.labels.get(OWNER_LABEL) != job.owner:
        # someone else finished or rolled back this relayout (another leader, an admin) or owns the node now:
        # nothing we remember about it still holds, so nothing is written
        return Step(Op.DROP, f"the node's {OWNER_LABEL} is {node.labels.get(OWNER_LABEL)!r}, not {job.owner!r}")
    waited = now - job.phase_since
    match job.phase:
        case Phase.CORDON:
            return Step(Op.CORDON)
        case Phase.WAIT_FREE:
            block = blocking_pods(gpu_pods, job.busy)
            if not block:
                return Step(Op.APPLY)
            what = ", ".join(f"{res}: {n} pod(s), {ok} may stay" for res, (n, ok) in block.items())
            if waited > timeout_s:
                return Step(Op.FAIL, f"pods still use the GPUs to change after {waited:.0f}s ({what})")
            return Step(Op.WAIT, f"waiting for pods to leave ({what})")
        case Phase.APPLY:
            return Step(Op.APPLY)
        case Phase.WAIT_SUCCESS:
            label = node.labels.get(MIG_CONFIG)
            state = node.labels.get(MIG_CONFIG_STATE)
            if label != job.config_name:
                return Step(Op.FAIL, f"{MIG_CONFIG} was changed to {label!r} by someone else")
            if state == STATE_SUCCESS:
                return Step(Op.UNCORDON, "MIG manager reports success")
            if state == STATE_FAILED:
                return Step(Op.FAIL, f"MIG manager reports {MIG_CONFIG_STATE}=failed for {job.config_name}")
            if waited > timeout_s:
                return Step(Op.FAIL, f"no {MIG_CONFIG_STATE}=success after {waited:.0f}s (state {state!r})")
            return Step(Op.WAIT, f"MIG manager state {state!r}")
        case Phase.UNCORDON:
            if (job.recovered and node.labels.get(MIG_CONFIG) == job.config_name
                    and node.labels.get(MIG_CONFIG_STATE) != STATE_SUCCESS):
                # adopted from a cache that had not yet seen the earlier leader's relabel: the node as just read
                # says the MIG manager is re-partitioning it now -- never uncordon under it; wait as after a relabel
                return decide(replace(job, phase=Phase.WAIT_SUCCESS), node, gpu_pods, now, timeout_s)
            return Step(Op.UNCORDON)
    return Step(Op.WAIT, f"phase {job.phase}")


class GateIO(Protocol):
    """The Kubernetes writes the gate needs (implemented by the actuator)."""

    async def read_node(self, name: str) -> NodeRead | None: ...

    async def cordon(self, name: str, config_name: str) -> bool:
        """Cordon ``name`` (and label it ours); True when we cordoned it, False when it already was (admin)."""
        ...

    async def uncordon(self, name: str, we_cordoned: bool, owner: str = "") -> None:
        """Uncordon ``name`` and remove our label, only if we cordoned it and it still carries ``owner``."""
        ...

    async def config_applied(self, node: NodeRead, config_name: str, config: dict) -> bool:
        """The node already runs ``config_name`` (label + state success) and the ConfigMap holds this entry."""
        ...

    async def write_config(self, config: dict) -> bool:
        """Merge ``config``'s ``mig-configs`` into the mig-parted ConfigMap; True when something changed."""
        ...

    async def relabel(self, name: str, config_name: str, owner: str | None = None) -> bool:
        """Set ``nvidia.com/mig.config=config_name`` and ``nvidia.com/mig.config.state=pending`` (and our owner label
        to ``config_name`` when ``owner`` is given) in one patch, if the node read right before still carries
        ``owner`` (None: not ours to check, an admin's cordon) and is still cordoned; False (nothing written)
        otherwise."""
        ...

    async def event(self, node: str, type_: str, reason: str, message: str) -> None: ...


class Report(Protocol):
    applied: list[str]
    skipped: list[tuple[str, str]]
    errors: list[str]
    pending: list[str]


@dataclass
class MigGate:
    """All relayouts in flight, at most ``max_nodes`` at a time; lives as long as the actuator."""

    max_nodes: int = 1
    timeout_s: float = 600.0
    retry_after_s: float = 600.0  # a failed (node, config) is not retried before this (no cordon/uncordon loops)
    jobs: dict[str, Relayout] = field(default_factory=dict)
    finished: dict[str, Relayout] = field(default_factory=dict)  # last finished relayout per node

    @property
    def in_flight(self) -> list[str]:
        return sorted(n for n, j in self.jobs.items() if j.active)

    def new_term(self) -> None:
        """Leadership was (re)gained: drop every relayout remembered from an earlier term (the other leader may
        have finished, rolled back or restarted them since) and the retry back-offs; the next tick's
        :meth:`recover` adopts what the node labels say now."""
        if self.jobs:
            log.warning("mig gate: a new leadership term forgets %d relayout(s) of the last one: %s",
                        len(self.jobs), ", ".join(sorted(self.jobs)))
        self.jobs.clear()
        self.finished.clear()

    def recover(self, view: ClusterView, now: float) -> None:
        """Adopt nodes a previous controller process cordoned (they carry :data:`OWNER_LABEL`)."""
        for name, info in view.nodes.items():
            owner = info.labels.get(OWNER_LABEL)
            if not owner or name in self.jobs:
                continue
            job = Relayout(name, owner, {}, {}, started=now, phase_since=now, we_cordoned=True, owner=owner,
                           recovered=True)
            # the relabel happened iff the node already names our config: then wait for the MIG manager;
            # otherwise nothing was changed yet and the cordon is simply undone (the plan re-issues the relayout)
            job.phase = Phase.WAIT_SUCCESS if info.labels.get(MIG_CONFIG) == owner else Phase.UNCORDON
            log.warning("mig relayout %s: adopting a relayout to %s left by a previous process (%s)",
                        name, owner, job.phase)
            self.jobs[name] = job

    def submit(self, action: SetMigLayout, now: float, report: Report) -> None:
        line = _line(action)
        job = self.jobs.get(action.node)
        if job is not None and job.active:
            if job.config_name == action.config_name:
                report.skipped.append((line, "in-flight"))
            elif job.phase in (Phase.CORDON, Phase.WAIT_FREE) and not job.recovered:
                # nothing written yet but the cordon: retarget (keep the cordon and its owner)
                job.config_name, job.config, job.busy, job.changed = (
                    action.config_name, action.config, dict(action.busy), action.changed)
                report.applied.append(f"{line}: retargeted the relayout in flight")
            else:
                report.skipped.append((line, "in-flight"))
            return
        last = self.finished.get(action.node)
        if (last is not None and last.phase is Phase.FAILED and last.config_name == action.config_name
                and now - last.phase_since < self.retry_after_s):
            report.skipped.append((line, "backoff"))
            return
        if len(self.in_flight) >= self.max_nodes:
            report.skipped.append((line, "rate-limit"))
            return
        self.jobs[action.node] = Relayout(action.node, action.config_name, action.config, dict(action.busy),
                                          action.changed, started=now, phase_since=now)

    async def tick(self, view: ClusterView, now: float, io: GateIO, report: Report) -> None:
        """Advance every relayout in flight by as many steps as this tick allows."""
        for name in list(self.jobs):
            job = self.jobs[name]
            try:
                await self._advance(job, view, now, io, report)
            except LeadershipLost:
                raise  # no node of this tick is touched any more
            except Exception as e:  # one node's failure must not stop the others (the job stays; next tick retries)
                log.exception("mig relayout %s: %s", name, e)
                report.errors.append(f"mig-layout {name}: {job.phase}: {_describe_error(e)}")
            if not job.active:
                self.finished[name] = self.jobs.pop(name)

    async def _advance(self, job: Relayout, view: ClusterView, now: float, io: GateIO, report: Report) -> None:
        info = view.nodes.get(job.node)
        gpu_pods = info.gpu_pods if info is not None else {}
        node = await io.read_node(job.node)
        prefix = f"mig-layout {job.node}"
        while True:
            step = decide(job, node, gpu_pods, now, self.timeout_s)
            match step.op:
                case Op.WAIT:
                    job.ticks_in_phase += 1
                    report.pending.append(f"{prefix}: {job.phase}: {step.why}")
                    return
                case Op.DROP:
                    job.outcome = step.why
                    job.enter(Phase.DONE, now)
                    return
                case Op.GONE:
                    job.outcome = step.why
                    job.enter(Phase.FAILED, now)
                    report.errors.append(f"{prefix}: {step.why}")
                    return
                case Op.CORDON:
                    assert node is not None
                    if await io.config_applied(node, job.config_name, job.config):
                        job.outcome = "already applied"
                        job.enter(Phase.DONE, now)
                        report.skipped.append((f"{prefix} -> {job.config_name}", "unchanged"))
                        return
                    job.we_cordoned = await io.cordon(job.node, job.config_name)
                    job.owner = job.config_name if job.we_cordoned else ""
                    report.applied.append(f"{prefix}: cordon" + ("" if job.we_cordoned else " (already cordoned)"))
                    await io.event(job.node, "Normal", "MigRelayoutStarted",
                                   f"re-partitioning GPUs {list(job.changed)} to {job.config_name}: node cordoned, "
                                   f"waiting for pods on the changing GPUs to leave")
                    job.enter(Phase.WAIT_FREE, now)
                    report.pending.append(f"{prefix}: {job.phase}: cordoned this tick")
                    return
                case Op.APPLY:
                    assert node is not None
                    changed = await io.write_config(job.config)
                    if node.labels.get(MIG_CONFIG) == job.config_name:
                        if changed:
                            await self._fail(job, now, io, report,
                                             f"{MIG_CONFIG} already is {job.config_name!r} but its mig-parted entry "
                                             f"changed: the MIG manager only reacts to a new label value")
                            return
                        report.applied.append(f"{prefix}: label already {job.config_name}")
                    else:
                        if not await io.relabel(job.node, job.config_name, job.owner if job.we_cordoned else None):
                            job.outcome = "the node changed before the relabel (no longer ours or uncordoned)"
                            report.skipped.append((f"{prefix} -> {job.config_name}", "node-changed"))
                            job.enter(Phase.DONE, now)
                            return
                        if job.we_cordoned:
                            job.owner = job.config_name  # the relabel renamed our owner label to this config
                        report.applied.append(f"{prefix}: relabel {MIG_CONFIG}={job.config_name}")
                    job.enter(Phase.WAIT_SUCCESS, now)
                    report.pending.append(f"{prefix}: {job.phase}: relabeled this tick")
                    return
                case Op.UNCORDON:
                    await io.uncordon(job.node, job.we_cordoned, job.owner)
                    job.outcome = step.why or "done"
                    report.applied.append(f"{prefix}: " + ("uncordon" if job.we_cordoned else "done (not ours)"))
                    relabeled = node is not None and node.labels.get(MIG_CONFIG) == job.config_name
                    await io.event(job.node, "Normal", "MigRelayoutDone",
                                   f"GPUs now partitioned as {job.config_name}" if relabeled
                                   else "relayout left unfinished by a previous controller process; node uncordoned")
                    job.enter(Phase.DONE, now)
                    return
                case Op.FAIL:
                    await self._fail(job, now, io, report, step.why)
                    return

    async def _fail(self, job: Relayout, now: float, io: GateIO, report: Report, why: str) -> None:
        await io.uncordon(job.node, job.we_cordoned, job.owner)
        job.outcome = why
        job.enter(Phase.FAILED, now)
        report.errors.append(f"mig-layout {job.node}: {why}" + ("; uncordoned" if job.we_cordoned else ""))
        await io.event(job.node, "Warning", "MigRelayoutFailed",
                       f"re-partitioning to {job.config_name} failed: {why}"
                       + ("; node uncordoned" if job.we_cordoned else ""))


def _line(action: SetMigLayout) -> str:
    return Plan(0.0, [action]).describe()[0]


def _describe_error(e: Exception) -> str:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None)
    return f"{status} {reason}" if status is not None else f"{type(e).__name__}: {e}"
