"""Lending in the simulator (issue 8): the training backlog and its sources, the executor of LendGpus /
ReclaimGpus in SimCluster, the static split, the scorecard's lending numbers and ``slotwise simulate --lending``."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.api.plan import LendGpus, PlaceReplica, Plan, ReclaimGpus, RemoveReplica
from autoscaler.api.spec import ModelSpec, slot_request
from autoscaler.cli.main import main
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import STATIC_TRAINING_MODEL, LendingViolation, SimCluster, static_owner
from autoscaler.sim.lending import LendingStats, Reclaim
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import COLUMNS, LENDING_COLUMNS, lending_card, scorecard
from autoscaler.sim.training import (
    BUNDLED,
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_GRACE_S,
    TrainingJob,
    TrainingQueue,
    bundled_training,
    load_training,
)
from autoscaler.sim.workload import build_workload
from forecasting.traces.model import RateSeries, TraceFormatError
from sharing.cluster import nodes_from_spec
from sharing.lending import LENT_MODEL, LendingPolicy, lent_owner
from sharing.packer import CostAwarePacker
from sharing.slots import AllocationError, Slot

POLICY = LendingPolicy(enabled=True, max_reclaim_s=120.0)
SPEC = ModelSpec(name="m", slo_latency_ms=500, gpu_memory_gib=20, gpu_compute_share=0.25, service_time_ms=100,
                 cold_start_s=60)
WHOLE = ModelSpec(name="w", slo_latency_ms=500, service_time_ms=100, cold_start_s=60)  # one whole GPU


def job(
    name: str, work_s: float, gpus: int = 1, ckpt: float = 600.0, grace: float = 30.0, prio: int = 0
) -> TrainingJob:
    return TrainingJob(f"training/{name}", gpus, work_s, ckpt, grace, prio)


def cluster(jobs: list[TrainingJob], nodes: str = "8xH100-80GB", policy: LendingPolicy | None = POLICY,
            specs: tuple[ModelSpec, ...] = (SPEC,)) -> SimCluster:
    return SimCluster(nodes_from_spec(nodes), [s.name for s in specs], {s.name: s for s in specs},
                      np.full(len(specs), 10.0), lending=policy, training=TrainingQueue(jobs))


def lend(c: SimCluster, now: float, devices: tuple[int, ...], node: str = "h100-80gb-0") -> None:
    c.apply(Plan(now, [LendGpus(node, devices, "H100-80GB", "test")]))
    c.advance(now)


def reclaim(c: SimCluster, now: float, devices: tuple[int, ...], workloads: tuple[str, ...] = (),
            deadline_s: float = 120.0, node: str = "h100-80gb-0") -> None:
    c.apply(Plan(now, [ReclaimGpus(node, devices, workloads, "forecast", deadline_s)]))
    c.advance(now)


def check_invariants(c: SimCluster) -> None:
    """What must hold after any sequence of plans: lent and training GPUs are training's alone."""
    inv = c.inventory
    for (node, dev), d in inv.devices.items():
        owners = [o for o, _ in d.entries]
        if (node, dev) in c.lent:
            assert owners == [lent_owner(node, dev)], (node, dev, owners)  # a lent GPU never holds a replica
            assert inv.model_of(owners[0]) == LENT_MODEL
        elif (node, dev) in c.static:
            assert owners == [static_owner(node, dev)]
        else:
            assert not any(o.startswith(("lent:", "training:")) for o in owners), (node, dev, owners)
    for i in range(len(c.models)):
        for r in c.replicas[i].values():
            for dev in r.slot.devices:
                assert (r.slot.node, dev) not in c.lent and (r.slot.node, dev) not in c.static
    for run in c.runs.values():
        pool = c.lent if run.lent else c.static
        assert all((run.node, d) in pool for d in run.devices), run
        assert run.lent or run.stop_at is None  # the static split is never preempted
    assert len(c.lent) == int(c.lent_by_kind.sum())


# ------------------------------------------------------------------------------------------------ executor


def test_lend_allocates_whole_gpus_to_lent_owners_and_starts_training() -> None:
    c = cluster([job("a", 5000), job("b", 5000), job("c", 5000)])
    lend(c, 100.0, (6, 7))
    assert c.lent == {("h100-80gb-0", 6): 100.0, ("h100-80gb-0", 7): 100.0}
    for dev in (6, 7):
        d = c.inventory.device("h100-80gb-0", dev)
        assert d.whole_owner == lent_owner("h100-80gb-0", dev)
        assert c.inventory.model_of(d.whole_owner) == LENT_MODEL
    assert c.snapshot(699.0).training[0].last_checkpoint_at is None
    snap = c.snapshot(700.0)
    assert dict(snap.lent) == c.lent
    assert [(w.name, w.kind, w.gpus, w.nodes, w.running, w.grace_s, w.started_at) for w in snap.training] == [
        ("training/a", "Job", 1.0, ("h100-80gb-0",), True, 30.0, 100.0),
        ("training/b", "Job", 1.0, ("h100-80gb-0",), True, 30.0, 100.0),
    ]
    assert [w.last_checkpoint_at for w in snap.training] == [700.0, 700.0]  # every 600 s of running
    assert [w.last_checkpoint_at for w in c.snapshot(1899.0).training] == [1300.0, 1300.0]
    # lent GPUs are used, not idle, in the cost accounting; nothing is lent twice
    assert c.lent_by_kind.tolist() == [2.0]
    lend(c, 200.0, (6,))
    assert c.lent[("h100-80gb-0", 6)] == 100.0 and c.stats.lends == 1 and len(c.runs) == 2
    check_invariants(c)


def test_without_lending_the_snapshot_is_the_plain_one() -> None:
    c = cluster([job("a", 5000)])
    snap = c.snapshot(0.0)
    assert snap.training == () and dict(snap.lent) == {}


def test_a_finished_job_is_followed_by_the_next_at_once_and_keeps_all_its_work() -> None:
    c = cluster([job("a", 1000), job("b", 400)])
    lend(c, 0.0, (0,))
    c.advance(999.0)
    assert list(c.runs) == ["training/a"]
    c.advance(1000.0)
    assert list(c.runs) == ["training/b"] and c.runs["training/b"].started_at == 1000.0
    c.advance(1400.0)  # the source cycles: a again, named for its second pass
    assert list(c.runs) == ["training/a-c1"] and c.runs["training/a-c1"].started_at == 1400.0
    assert c.stats.jobs_finished == 2 and c.stats.goodput_lent_s == pytest.approx(1400.0)
    assert c.stats.lost_s == 0.0


def test_reclaim_loses_work_since_the_checkpoint_frees_after_grace_and_records_the_duration() -> None:
    c = cluster([job("a", 10_000, grace=30.0), job("b", 10_000)])
    lend(c, 0.0, (3,))
    reclaim(c, 1000.0, (3,), ("training/a",))
    run = c.runs["training/a"]
    assert run.sigterm_at == 1000.0 and run.stop_at == 1030.0
    # stopping: still lent and occupied, not offered to the core as a running workload, nothing new starts
    c.advance(1029.0)
    assert ("h100-80gb-0", 3) in c.lent and c.inventory.device("h100-80gb-0", 3).whole_owner is not None
    assert c.snapshot(1029.0).training == ()
    c.advance(1030.0)
    assert ("h100-80gb-0", 3) not in c.lent and c.inventory.device("h100-80gb-0", 3).idle
    assert not c.runs
    (rec,) = c.stats.reclaims
    assert rec.duration_s == pytest.approx(30.0) and rec.reason == "forecast" and rec.deadline_s == 120.0
    # checkpoint at 600 s: 400 s lost, 600 s kept; 30 s spent stopping
    assert c.stats.lost_s == pytest.approx(400.0)
    assert c.stats.goodput_lent_s == pytest.approx(600.0)
    assert c.stats.grace_s == pytest.approx(30.0)
    assert c.stats.preemptions == 1
    # the preempted job waits at the front with what it kept, and resumes before new work
    (q,) = c.training.waiting
    assert q.name == "training/a" and q.done_s == pytest.approx(600.0) and q.remaining_s == pytest.approx(9400.0)
    lend(c, 2000.0, (5,))
    assert list(c.runs) == ["training/a"]
    c.advance(2000.0 + 9400.0)
    assert c.stats.jobs_finished == 1 and c.runs and "training/a" not in c.runs
    assert c.stats.goodput_lent_s == pytest.approx(10_000.0)
    check_invariants(c)


def test_reclaim_of_an_idle_lent_gpu_is_immediate_and_repeats_and_strangers_change_nothing() -> None:
    c = cluster([job("a", 10_000, gpus=2)])
    lend(c, 0.0, (0,))  # a 2-GPU job cannot start on one lent GPU
    assert not c.runs
    reclaim(c, 50.0, (0,))
    (rec,) = c.stats.reclaims
    assert rec.duration_s == 0.0 and not c.lent
    reclaim(c, 60.0, (0, 1))  # nothing lent: no-ops, no record
    assert len(c.stats.reclaims) == 1 and c.stats.reclaim_noops == 2
    lend(c, 100.0, (0, 1))
    reclaim(c, 200.0, (0,))
    reclaim(c, 210.0, (0,))  # already coming back: the first reclaim stands
    assert len(c.stats.reclaims) == 2 and c.stats.reclaims[1].decided_at == 200.0


def test_multi_gpu_jobs_run_on_one_node_and_a_partial_reclaim_stops_the_whole_job() -> None:
    c = cluster([job("big", 10_000, gpus=2), job("small", 10_000)], nodes="16xH100-80GB")
    lend(c, 0.0, (0,))  # one GPU: the 2-GPU job waits, the small one runs
    assert [(r.job.name, r.node) for r in c.runs.values()] == [("training/small", "h100-80gb-0")]
    assert [q.name for q in c.training.waiting] == ["training/big"]
    lend(c, 10.0, (1, 2), node="h100-80gb-1")
    big = c.runs["training/big"]
    assert big.node == "h100-80gb-1" and big.devices == (1, 2)
    reclaim(c, 100.0, (2,), node="h100-80gb-1")
    assert big.stop_at == 130.0  # the whole job stops, not only its reclaimed GPU
    c.advance(130.0)
    # GPU 2 went back; GPU 1 stays lent and takes the next job that fits (the big one waits again)
    assert ("h100-80gb-1", 2) not in c.lent and ("h100-80gb-1", 1) in c.lent
    assert [r.job.name for r in c.runs.values() if r.node == "h100-80gb-1"] == ["training/small-c1"]
    assert c.training.waiting[0].name == "training/big"
    check_invariants(c)


def test_jobs_with_a_grace_period_longer_than_the_deadline_never_start_on_lent_gpus() -> None:
    c = cluster([job("slow", 10_000, grace=300.0), job("fast", 10_000, grace=30.0)],
                policy=LendingPolicy(enabled=True, max_reclaim_s=120.0))
    lend(c, 0.0, tuple(range(4)))
    assert {r.job.job.grace_s for r in c.runs.values()} == {30.0}
    assert c.training.skipped_grace >= 1
    # ... while a static split (never preempted) runs it
    s = cluster([job("slow", 10_000, grace=300.0)])
    s.reserve_static_training(2)
    assert {r.job.job.grace_s for r in s.runs.values()} == {300.0}


def test_a_late_reclaim_is_measured_against_its_deadline() -> None:
    c = cluster([job("a", 10_000, grace=30.0)])
    lend(c, 0.0, (0,))
    reclaim(c, 100.0, (0,), deadline_s=10.0)
    c.advance(130.0)
    (rec,) = c.stats.reclaims
    assert rec.duration_s == pytest.approx(30.0) and rec.duration_s > rec.deadline_s


def test_training_never_takes_a_gpu_holding_inference_and_inference_never_lands_on_a_lent_gpu() -> None:
    c = cluster([job("a", 10_000)], nodes="8xH100-80GB:mig")
    slot = CostAwarePacker().place(c.inventory, slot_request(SPEC))
    assert slot is not None
    c.apply(Plan(0.0, [PlaceReplica("m", "m-1", slot)]))
    before = c.inventory.copy()
    with pytest.raises(LendingViolation, match="not idle"):
        c.apply(Plan(1.0, [LendGpus(slot.node, (7, slot.devices[0]), "H100-80GB")]))
    assert c.inventory == before and not c.lent  # checked before anything was taken
    others = tuple(d for d in range(8) if d != slot.devices[0])
    lend(c, 2.0, others, node=slot.node)
    lent_slot = Slot.whole(slot.node, others[0], c.inventory.gpu_of(slot.node))
    with pytest.raises(LendingViolation, match="inference never lands"):
        c.apply(Plan(3.0, [PlaceReplica("m", "m-2", lent_slot)]))
    with pytest.raises(AllocationError):  # the inventory itself refuses, too
        c.inventory.allocate(lent_slot, "m-2")
    # the packer sees no room on lent GPUs: the next slices go on the replica's own GPU, then nowhere
    inv = c.inventory.copy()
    while (s := CostAwarePacker().place(inv, slot_request(SPEC))) is not None:
        assert s.devices == slot.devices
        inv.allocate(s, f"m-x{len(list(inv.allocations()))}")
    check_invariants(c)


@st.composite
def _ops(draw: st.DrawFn) -> list[tuple]:
    n = draw(st.integers(1, 40))
    return [draw(st.tuples(st.sampled_from(["lend", "reclaim", "place", "remove", "advance"]),
                           st.integers(0, 15), st.integers(1, 4), st.floats(0.0, 900.0)))
            for _ in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops(), grace=st.sampled_from([0.0, 30.0, 90.0]))
def test_property_training_and_inference_never_share_a_gpu(ops: list[tuple], grace: float) -> None:
    """Random plans (lend idle GPUs, reclaim lent ones, place and remove whole-GPU replicas) over time: a lent GPU
    never holds a replica, training only ever runs on lent (or static) GPUs, a lend of a busy GPU is refused, every
    reclaim finishes within the longest grace period, lending never touches a replica, and the lent accounting
    matches."""
    jobs = [job(f"j{k}", w, gpus=g, grace=grace) for k, (w, g) in enumerate([(500, 1), (2000, 2), (90, 1)])]
    c = cluster(jobs, nodes="16xH100-80GB", specs=(WHOLE,))
    c.reserve_static_training(1)
    now, seq = 0.0, 0
    packer = CostAwarePacker()
    for kind, dev, count, dt in ops:
        node = f"h100-80gb-{dev % 2}"
        devs = tuple(sorted({(dev + k) % 8 for k in range(count)}))
        replicas = {rid: (r.slot, r.release_at) for rid, r in c.replicas[0].items()}
        if kind == "advance":
            now += dt
            c.advance(now)
        elif kind == "lend":
            busy = any(c.inventory.device(node, d).entries and (node, d) not in c.lent for d in devs)
            if busy:
                with pytest.raises(LendingViolation):
                    c.apply(Plan(now, [LendGpus(node, devs, "H100-80GB")]))
            else:
                c.apply(Plan(now, [LendGpus(node, devs, "H100-80GB")]))
        elif kind == "reclaim":
            c.apply(Plan(now, [ReclaimGpus(node, devs, (), "forecast", 120.0)]))
        elif kind == "place":
            slot = packer.place(c.inventory, slot_request(WHOLE))
            if slot is not None:
                seq += 1
                c.apply(Plan(now, [PlaceReplica("w", f"w-{seq}", slot)]))
        elif c.replicas[0]:
            c.apply(Plan(now, [RemoveReplica("w", next(iter(c.replicas[0])))]))
        if kind in ("lend", "reclaim"):  # lending never evicts, moves or drains inference
            assert {rid: (r.slot, r.release_at) for rid, r in c.replicas[0].items()} == replicas
        c.advance(now)
        check_invariants(c)
    c.advance(now + 1000.0)
    for rec in c.stats.reclaims:
        assert rec.freed_at is not None and rec.duration_s <= grace + 1e-9
    # work is conserved: kept + lost never exceeds what ran
    assert c.stats.lost_s >= 0 and c.stats.goodput_lent_s >= 0


def test_static_split_takes_whole_nodes_from_the_end_and_never_preempts() -> None:
    c = cluster([job("a", 100.0)], nodes="24xH100-80GB")
    taken = c.reserve_static_training(10)
    assert {n for n, _ in taken} == {"h100-80gb-2", "h100-80gb-1"}
    assert sum(1 for n, _ in taken if n == "h100-80gb-2") == 8
    assert c.pool_gpus == 14
    for node, dev in taken:
        owner = c.inventory.device(node, dev).whole_owner
        assert owner == static_owner(node, dev) and c.inventory.model_of(owner) == STATIC_TRAINING_MODEL
    assert len(c.runs) == 10 and not any(r.lent for r in c.runs.values())
    # the core never sees the static split as lent, preemptible capacity
    snap = c.snapshot(0.0)
    assert dict(snap.lent) == {} and snap.training == ()
    # a reclaim cannot touch it
    reclaim(c, 5.0, (0, 1), ("training/a",), node="h100-80gb-2")
    assert len(c.runs) == 10 and c.stats.preemptions == 0
    with pytest.raises(ValueError, match="idle GPUs"):
        cluster([job("a", 100.0)], nodes="8xH100-80GB").reserve_static_training(9)


# ------------------------------------------------------------------------------------------------ the backlog


def test_queue_cycles_in_source_order_and_preempted_jobs_come_first_by_priority() -> None:
    q = TrainingQueue([job("a", 10), job("b", 10), job("hi", 10, prio=5)])
    got = [q.take(8).name for _ in range(4)]
    assert got == ["training/a", "training/b", "training/hi", "training/a-c1"]
    a, hi = q.take(8), q.take(8)
    assert (a.name, hi.name) == ("training/b-c1", "training/hi-c1")
    q.requeue(a)
    q.requeue(hi)
    assert [x.name for x in q.waiting] == ["training/hi-c1", "training/b-c1"]
    # too big for what is offered: it waits, and the next job that fits comes instead
    q2 = TrainingQueue([job("big", 10, gpus=4), job("one", 10)])
    assert q2.take(2).name == "training/one" and [x.name for x in q2.waiting] == ["training/big"]
    assert q2.take(4).name == "training/big"
    assert TrainingQueue([job("big", 10, gpus=4)]).take(2) is None
    with pytest.raises(ValueError):
        TrainingQueue([])


# ------------------------------------------------------------------------------------------------ sources

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time," \
             "scheduled_time"


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_alibaba_pod_list_mapping(tmp_path: Path) -> None:
    f = write(tmp_path / "pods.csv", [
        POD_HEADER,
        "p-ls,1000,1024,1,1000,,LS,Running,0,100,0",  # latency-sensitive: not training
        "p-cpu,1000,1024,0,0,,BE,Running,0,100,0",  # CPU only
        "p-share,1000,1024,1,460,,BE,Running,10,110,10",  # a shared GPU: still 1 whole GPU
        "p-two,1000,1024,2,1000,,BE,Failed,5,505,6",
        "p-nodel,1000,1024,1,1000,,BE,Running,5,,5",  # no deletion time
        "p-zero,1000,1024,1,1000,,BE,Running,5,5,5",  # zero lifetime
        "p-pend,1000,1024,1,1000,,BE,Pending,5,50,",  # never scheduled: no work observed
    ])
    jobs = load_training(f, checkpoint_every_s=300.0, grace_s=20.0)
    assert jobs == (
        TrainingJob("training/p-share", 1, 100.0, 300.0, 20.0, 0),
        TrainingJob("training/p-two", 2, 500.0, 300.0, 20.0, 0),
    )


def test_the_bundled_slice_is_small_and_the_mapping_of_the_whole_default_list(tmp_path: Path) -> None:
    path = bundled_training()[BUNDLED]
    assert path.stat().st_size < 100_000
    with gzip.open(path, "rt") as fh:
        assert fh.readline().strip() == POD_HEADER
    jobs = load_training()
    assert jobs == load_training(BUNDLED)
    assert len(jobs) > 2000 and all(j.gpus >= 1 and j.work_s > 0 for j in jobs)
    assert {j.checkpoint_every_s for j in jobs} == {DEFAULT_CHECKPOINT_EVERY_S}
    assert {j.grace_s for j in jobs} == {DEFAULT_GRACE_S}
    assert (path.parent / "ATTRIBUTION.md").exists()
    shared = Path(__file__).resolve().parents[3] / "shared/data/alibaba_gpu_v2023/openb_pod_list_default.csv"
    if shared.exists():  # the slice is the full list's BE rows: the same jobs
        assert load_training(shared) == jobs


def test_job_list_with_defaults(tmp_path: Path) -> None:
    f = write(tmp_path / "jobs.csv", ["name,gpus,work_s,grace_s,priority", "x,2,3600,,1", "ns/y,1,60,10,"])
    a, b = load_training(f, checkpoint_every_s=120.0, grace_s=25.0)
    assert a == TrainingJob("training/x", 2, 3600.0, 120.0, 25.0, 1)
    assert b == TrainingJob("ns/y", 1, 60.0, 120.0, 10.0, 0)


@pytest.mark.parametrize(
    ("lines", "line", "field", "message"),
    [
        (["gpus", "1"], 1, "work_s", "missing column"),
        (["gpus,work_s", "1,10", "1,abc"], 3, "work_s", "not a number"),
        (["gpus,work_s", "1,10", "0,10"], 3, "gpus", "below 1"),
        (["gpus,work_s", "1,0"], 2, "work_s", "must be > 0"),
        (["gpus,work_s,checkpoint_every_s", "1,10,0"], 2, "checkpoint_every_s", "must be > 0"),
        (["gpus,work_s,grace_s", "1,10,-5"], 2, "grace_s", "negative"),
        (["gpus,work_s", "1.5,10"], 2, "gpus", "not an integer"),
        ([POD_HEADER, "p,1,1,x,1000,,BE,Running,0,10,0"], 2, "num_gpu", "not a number"),
        ([POD_HEADER, "p,1,1,1,1000,,BE,Running,0,10,0", "q,1,1,1,1500,,BE,Running,0,10,0"], 3, "gpu_milli",
         "above 1000"),
        ([POD_HEADER, "p,1,1,1,1000,,BE,Running,0,zz,0"], 2, "deletion_time", "not a number"),
        ([POD_HEADER.replace(",qos", ",kind"), "p,1,1,1,1000,,BE,Running,0,10,0"], 1, "qos", "missing column"),
        ([POD_HEADER, "p,1,1,1,1000,,LS,Running,0,10,0"], None, None, "no best-effort GPU pods"),
    ],
)
def test_a_bad_training_file_names_file_line_and_field(
    tmp_path: Path, lines: list[str], line: int | None, field: str | None, message: str
) -> None:
    f = write(tmp_path / "bad.csv", lines)
    with pytest.raises(TraceFormatError) as e:
        load_training(f)
    assert (e.value.path, e.value.line, e.value.field) == (str(f), line, field)
    assert message in e.value.message


def test_unknown_training_source() -> None:
    with pytest.raises(FileNotFoundError, match="nor a bundled training source"):
        load_training("no-such-source")


# ------------------------------------------------------------------------------------------------ in simulate()


def _workload(hours: float = 1.0, rate: float = 2.0) -> object:
    t = np.arange(0.0, hours * 3600.0, 60.0)
    trace = RateSeries(start_s=0.0, step_s=60.0, models=("m",), rates=np.full((1, t.size), rate))
    return build_workload(trace, {"m": SPEC})


def test_static_split_in_a_run_trains_on_every_split_gpu_all_the_scored_time() -> None:
    jobs = (job("a", 700.0), job("b", 1300.0))
    cfg = SimConfig(static_training_gpus=3, training=jobs, burn_in_s=300.0)
    res = simulate(_workload(), nodes_from_spec("16xH100-80GB"), make_policy("slotwise"), cfg)
    card = scorecard(res)
    # back to back, never preempted: every split GPU trains the whole scored period
    assert res.lending.goodput_static_s == pytest.approx(3 * res.scored_s)
    assert card["training_goodput_gpu_hours"] == pytest.approx(3 * res.scored_s / 3600.0)
    assert card["training_lost_gpu_hours"] == 0.0 and card["reclaims"] == 0
    assert card["lending"]["pool_gpus"] == 13 and card["lent_gpu_hours"] == 0.0
    # idle reserved = the pool less what inference held
    assert card["idle_reserved_gpu_hours"] == pytest.approx(13 * res.scored_s / 3600.0 - card["gpu_hours"])


def test_lending_off_leaves_the_run_unchanged() -> None:
    w, nodes = _workload(), nodes_from_spec("16xH100-80GB")
    plain = scorecard(simulate(w, nodes, make_policy("slotwise"), SimConfig()))
    off = scorecard(simulate(w, nodes, make_policy("slotwise"),
                             SimConfig(lending=LendingPolicy(enabled=False), training=(job("a", 10.0),))))
    for card in (plain, off):
        card.pop("sim_wall_s")
    assert plain == off
    assert plain["lending"] is None and plain["lent_gpu_hours"] == 0.0 and plain["reclaims"] == 0
    assert plain["lending_efficiency"] == 0.0 and plain["reclaim_p50_s"] is None
    # idle reserved is the cluster less what inference held, lending or not
    assert plain["idle_reserved_gpu_hours"] == pytest.approx(16 * plain["cost"]["hours"] - plain["gpu_hours"])


def test_scorecard_lending_numbers() -> None:
    res = simulate(_workload(0.5), nodes_from_spec("8xH100-80GB"), make_policy("slotwise"), SimConfig())
    stats = LendingStats(goodput_lent_s=7200.0, lost_s=360.0)
    durations = [0.0] + [30.0] * 97 + [60.0, 150.0]  # 100 reclaims: one past its 120 s deadline
    stats.reclaims = [Reclaim("n", (0,), "forecast", 10.0 * k, 120.0, freed_at=10.0 * k + d)
                      for k, d in enumerate(durations)]
    stats.reclaims.append(Reclaim("n", (1,), "shortfall", res.end_s - 200.0, 120.0, pending={1}))  # open, late
    r = dataclasses.replace(res, lending=stats, lending_policy=POLICY, lent_gpu_seconds=np.array([3 * 3600.0]),
                            idle_reserved_gpu_seconds=4 * 3600.0)
    card = lending_card(r)
    assert card["lent_gpu_hours"] == 3.0 and card["idle_reserved_gpu_hours"] == 4.0
    assert card["lending_efficiency"] == 0.75
    assert card["reclaims"] == 101 and card["reclaims_late"] == 2
    assert card["reclaim_p50_s"] == 30.0 and card["reclaim_p99_s"] == 60.0
    assert card["reclaims_within_deadline"] == pytest.approx(99 / 101)
    assert card["reclaim_max_late_s"] == pytest.approx(80.0)
    assert card["training_goodput_gpu_hours"] == 2.0 and card["training_lost_gpu_hours"] == 0.1
    assert card["lending"]["reclaims_by_reason"] == {"forecast": 100, "shortfall": 1}
    assert card["lending"]["reclaims_open"] == 1
    full = scorecard(r)
    for key in LENDING_COLUMNS:
        assert full[key] == card[key] and key not in COLUMNS
    assert full["cost"]["lent_gpu_hours"] == 3.0
    assert full["cost"]["lent_value_usd"] == pytest.approx(3.0 * res.prices["H100-80GB"])
    json.dumps(full)  # the JSON the CLI writes


# ------------------------------------------------------------------------------------------------ the CLI


def test_cli_lending_knobs_need_lending(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--trace", "azure-llm-2023", "--hours", "0.1", "--policy", "hpa", "--max-reclaim-s", "60",
               "--lending-mode", "kueue"])
    assert rc == 2 and "--lending-mode, --max-reclaim-s set lending knobs: add --lending" in capsys.readouterr().err


def test_cli_bad_training_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path / "jobs.csv", ["gpus,work_s", "1,-3"])
    rc = main(["simulate", "--trace", "azure-llm-2023", "--hours", "0.1", "--policy", "hpa",
               "--static-training-gpus", "2", "--training", str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{f}:2: field 'work_s'" in err and err.count("\n") == 1


def test_cli_static_split_shows_the_lending_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    rc = main(["simulate", "--trace", "azure-llm-2023", "--hours", "0.25", "--policy", "slotwise",
               "--static-training-gpus", "4", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0 and "training_goodput_gpu_hours" in printed and "reclaim_p99_s" in printed
    [card] = json.loads(out.read_text())["results"]
    assert card["lending"]["static_training_gpus"] == 4 and card["training_goodput_gpu_hours"] > 0


def test_cli_simulate_with_lending_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    # (kueue mode lends single GPUs: on this small cluster pods mode, whole idle nodes only, may find none)
    rc = main(["simulate", "--trace", "azure-llm-2023", "--hours", "0.5", "--policy", "slotwise", "--lending",
               "--lending-mode", "kueue", "--max-reclaim-s", "90", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0 and "lending_efficiency" in printed
    [card] = json.loads(out.read_text())["results"]
    assert card["lending"]["policy"]["max_reclaim_s"] == 90.0 and card["lending"]["policy"]["mode"] == "kueue"
    assert card["lent_gpu_hours"] > 0 and 0 < card["lending_efficiency"] <= 1.0
    assert card["lent_gpu_hours"] <= card["idle_reserved_gpu_hours"] + 1e-9
    assert card["training_goodput_gpu_hours"] > 0
    assert card["reclaims_late"] == 0 or card["reclaim_max_late_s"] <= DEFAULT_GRACE_S
    assert math.isfinite(card["slo_attainment"])


# ------------------------------------------------------------------------------------------------ bench verdicts

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "lending.py"


def _bench():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_lending", _BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _card(**kw: object) -> dict:
    base = {"lending_efficiency": 0.0, "reclaims": 0, "reclaims_within_deadline": None, "reclaim_max_late_s": 0.0,
            "requests_within_latency": 0.99, "slo_attainment": 0.98, "training_goodput_gpu_hours": 0.0}
    return base | kw


def test_bench_verdicts_follow_the_issue_targets() -> None:
    verdicts = _bench().verdicts
    off = _card()
    good = _card(lending_efficiency=0.7, reclaims=200, reclaims_within_deadline=0.99, reclaim_max_late_s=30.0,
                 requests_within_latency=0.989, slo_attainment=0.979, training_goodput_gpu_hours=10.0)
    static = _card(training_goodput_gpu_hours=8.0, requests_within_latency=0.98)
    v = verdicts({"no lending": off, "lending": good, "static split": static}, grace_s=30.0)
    assert {k: x["verdict"] for k, x in v.items()} == {
        "efficiency": "PASS", "reclaims": "PASS", "attainment": "PASS", "goodput_vs_static": "REPORTED"}
    assert v["goodput_vs_static"]["value"] == pytest.approx(1.25)
    assert v["goodput_vs_static"]["static_attainment_drop_pp"] == pytest.approx(1.0)
    bad = [
        dict(lending_efficiency=0.69),
        dict(reclaims_within_deadline=0.985),
        dict(reclaim_max_late_s=30.5),
        dict(requests_within_latency=0.9888),  # -0.12 pp
        dict(slo_attainment=0.9788),
    ]
    names = ["efficiency", "reclaims", "reclaims", "attainment", "attainment"]
    for change, name in zip(bad, names, strict=True):
        v = verdicts({"no lending": off, "lending": good | change}, grace_s=30.0)
        assert v[name]["verdict"] == "FAIL", change
        assert v["goodput_vs_static"]["verdict"].startswith("N/A")
    assert verdicts({"no lending": off, "lending": _card(lending_efficiency=0.9)}, 30.0)["reclaims"]["verdict"] \
        == "PASS"  # no reclaims: nothing late
