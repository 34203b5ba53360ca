"""Scenario files (issue 9 point 3): the loader, the events in the simulator, and ``simulate --scenario``."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from autoscaler.cli.main import main
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.policies import make_policy
from autoscaler.sim.cluster import SimCluster
from autoscaler.sim.harness import shipped_scenarios
from autoscaler.sim.run import ClusterEvent, SimConfig, _warm_start, apply_event, simulate
from autoscaler.sim.scenario import ScenarioError, load_scenario
from autoscaler.sim.workload import build_workload, served_as
from sharing.packer import CostAwarePacker

SHIPPED = ("balanced-day", "resource-tight-day", "failure-day")

BASE = """\
duration: 1
teams:
  - {name: a, guaranteed_gpus: 4, borrowing_limit_gpus: 2}
  - {name: b, guaranteed_gpus: 2}
models:
  - {name: chat, team: a, priority: 10, trace: azure-llm-2023, model: conv, slo-latency-ms: 2000}
  - {name: fn, team: b, trace: azure-functions-2019, model: fn-1992918c}
cluster: "16xH100-80GB:mig"
"""


def assert_problem(text: str, key: str, message: str) -> None:
    """One line of the error names the file and the key path, and says ``message``."""
    lines = [x for x in text.splitlines() if x.startswith(f"bad.yaml: {key}: ")]
    assert lines and any(message in x for x in lines), text


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_load(name: str) -> None:
    sc = load_scenario(shipped_scenarios()[name])
    assert sc.name == name
    assert len(sc.teams) == 3
    assert {m.spec.priority for m in sc.models} == {100, 50, 10}
    assert all(m.spec.team in {t.name for t in sc.teams} for m in sc.models)
    trace = sc.build_trace(0.5)
    # the history (the forecaster's warm start) comes first, then the half hour asked for
    assert trace.rates.shape == (len(sc.models), round(sc.history_h * 60) + 30) and (trace.rates >= 0).all()
    assert sum(n.gpu_count for n in sc.cluster) > 0


def test_failure_day_has_node_loss_at_peak() -> None:
    sc = load_scenario(shipped_scenarios()["failure-day"])
    assert [e.kind for e in sc.cluster_events] == ["node_lost"]
    assert sc.cluster_events[0].at_s == 29 * 60
    assert sc.training is not None and sc.training.lending


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (("duration: 1", "duration: 0"), "duration", "must be > 0"),
        (("duration: 1", "durration: 1"), "durration", "unknown key"),
        (("guaranteed_gpus: 2}", "guaranteed_gpus: -2}"), "teams[1].guaranteed_gpus", "must be >= 0"),
        (("borrowing_limit_gpus: 2}", "borrowing_limit_gpus: 2, quota: 3}"), "teams[0].quota", "unknown key"),
        (("slo-latency-ms: 2000}", "slo-latency-ms: -5}"), "models[0].slo-latency-ms", "must be a positive number"),
        (("slo-latency-ms: 2000}", "slo-latency-ms: 2000, slo-latncy: 3}"), "models[0].slo-latncy", "unknown key"),
        (("team: b,", "team: c,"), "models[1].team", "not one of the teams"),
        (("model: conv,", "model: nope,"), "models[0].model", "not a model of"),
        (("trace: azure-llm-2023,", "trace: no-such-trace,"), "models[0].trace", "no such file"),
        (("model: conv,", "model: conv, scale: 0,"), "models[0].scale", "must be > 0"),
        (('cluster: "16xH100-80GB:mig"', 'cluster: "16xNoSuchGPU"'), "cluster", ""),
        (("borrowing_limit_gpus: 2}", "borrowing_limit_gpus: -1}"), "teams[0].borrowing_limit_gpus", "must be >= 0"),
        (("borrowing_limit_gpus: 2}", "borrowing_limit_gpus: lots}"), "teams[0].borrowing_limit_gpus",
         "must be a number"),
        (("duration: 1", "duration: 1\nrequest_timeout_s: 0"), "request_timeout_s", "must be > 0"),
        (("duration: 1", "duration: 1\narbitration: {mode: fair}"), "arbitration.mode",
         "must be one of slo, priority, partition"),
        (("duration: 1", "duration: 1\narbitration: {preemption: sometimes}"), "arbitration.preemption",
         "must be true or false"),
        (("duration: 1", "duration: 1\narbitration: {min_runtime_s: -5}"), "arbitration.min_runtime_s",
         "must be >= 0"),
        (("duration: 1", "duration: 1\narbitration: {fairness_half_life_s: soon}"),
         "arbitration.fairness_half_life_s", "must be a number"),
        (("duration: 1", "duration: 1\narbitration: {max_preemptions_per_tick: 1.5}"),
         "arbitration.max_preemptions_per_tick", "must be an integer >= 0"),
        (("duration: 1", "duration: 1\narbitration: {mode: slo, preempt: false}"), "arbitration.preempt",
         "unknown key"),
        (("duration: 1", "duration: 1\narbitration: [slo]"), "arbitration", "must be a mapping"),
    ],
)
def test_bad_input_names_file_and_key(tmp_path: Path, change: tuple[str, str], key: str, message: str) -> None:
    assert change[0] in BASE
    path = write(tmp_path, BASE.replace(change[0], change[1], 1))
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert_problem(str(e.value), key, message)


def test_arbitration_block_and_teams_become_the_policy(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, BASE))
    # no arbitration block: the defaults, with the teams' quotas (absent borrowing limit = no limit)
    assert sc.arbitration == ArbitrationPolicy(teams=(TeamQuota("a", 4.0, 2.0), TeamQuota("b", 2.0, None)))
    assert sc.teams == sc.arbitration.teams and sc.arbitration.quota("b").limit_gpus == math.inf
    assert sc.request_timeout_s == 60.0
    text = BASE.replace("duration: 1", "duration: 1\nrequest_timeout_s: 30\narbitration:\n  mode: partition\n"
                        "  preemption: false\n  min_runtime_s: 120\n  max_preemptions_per_tick: 2\n"
                        "  fairness_half_life_s: 600")
    sc = load_scenario(write(tmp_path, text.replace("{name: b, guaranteed_gpus: 2}",
                                                    "{name: b, guaranteed_gpus: 2, borrowing_limit_gpus: null}")))
    assert sc.arbitration == ArbitrationPolicy(mode="partition", teams=(TeamQuota("a", 4.0, 2.0), TeamQuota("b", 2.0)),
                                               preemption=False, min_runtime_s=120.0, max_preemptions_per_tick=2,
                                               fairness_half_life_s=600.0)
    assert sc.request_timeout_s == 30.0


def test_every_bad_arbitration_value_is_reported_at_once(tmp_path: Path) -> None:
    text = BASE.replace("duration: 1", "duration: 1\narbitration: {mode: x, preemption: 1, min_runtime_s: -1}")
    with pytest.raises(ScenarioError) as e:
        load_scenario(write(tmp_path, text))
    for key in ("arbitration.mode", "arbitration.preemption", "arbitration.min_runtime_s"):
        assert f"bad.yaml: {key}: " in str(e.value)


@pytest.mark.parametrize(
    ("events", "key", "message"),
    [
        ("- {at: 60, kind: explode}", "events[0].kind", "must be one of"),
        ("- {at: '1:75', kind: gpu_kind_removed, gpu_kind: H100-80GB}", "events[0].at", "must be seconds or"),
        ("- {at: 7200, kind: gpu_kind_removed, gpu_kind: H100-80GB}", "events[0].at", "after the end"),
        ("- {at: 60, kind: gpu_kind_removed, gpu_kind: L4}", "events[0].gpu_kind", "no L4"),
        ("- {at: 60, kind: node_lost, node: nowhere}", "events[0].node", "no node 'nowhere'"),
        ("- {at: 60, kind: node_lost, gpu_kind: H100-80GB, count: 0}", "events[0].count", "integer >= 1"),
        ("- {at: 60, kind: node_lost}", "events[0]", "either 'node'"),
        ("- {at: 60, kind: node_lost, gpu_kind: H100-80GB, holding: nobody}", "events[0].holding",
         "no model or team 'nobody'"),
        ("- {at: 60, kind: surge, target: chat, multiplier: 2, duration_s: 60, extra: 1}", "events[0].extra",
         "unknown key"),
        ("- {at: 60, kind: surge, target: nobody, multiplier: 2, duration_s: 60}", "events[0].target",
         "neither a model"),
        ("- {at: 60, kind: surge, target: all, multiplier: 0, duration_s: 60}", "events[0].multiplier", "> 0"),
    ],
)
def test_bad_events_name_file_and_key(tmp_path: Path, events: str, key: str, message: str) -> None:
    path = write(tmp_path, BASE + "events:\n  " + events + "\n")
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert_problem(str(e.value), key, message)


def test_bad_training_and_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + "training: {source: nothing-here, grace_s: -1, lending: maybe}\n")
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    text = str(e.value)
    for key in ("training.source", "training.grace_s", "training.lending"):
        assert f"bad.yaml: {key}:" in text
    with pytest.raises(ScenarioError, match=r"bad\.yaml: not valid YAML"):
        load_scenario(write(tmp_path, "teams: [\n"))
    with pytest.raises(ScenarioError, match=r"bad\.yaml: models: is required"):
        load_scenario(write(tmp_path, "duration: 1\nteams: [{name: a}]\ncluster: 8xL4\n"))


def test_surge_multiplies_arrivals_in_its_window(tmp_path: Path) -> None:
    plain = load_scenario(write(tmp_path, BASE, "plain.yaml"))
    surged = load_scenario(write(
        tmp_path, BASE + "events:\n  - {at: '00:10', kind: surge, target: a, multiplier: 3, duration_s: 600}\n",
        "surge.yaml"))
    a, b = plain.build_trace(), surged.build_trace()
    chat, fn = a.models.index("chat"), a.models.index("fn")
    window = slice(10, 20)  # one-minute steps
    np.testing.assert_allclose(b.rates[chat, window], 3 * a.rates[chat, window])
    np.testing.assert_allclose(b.rates[chat, :10], a.rates[chat, :10])
    np.testing.assert_allclose(b.rates[chat, 20:], a.rates[chat, 20:])
    np.testing.assert_allclose(b.rates[fn], a.rates[fn])  # team b is not surged
    assert b.rates[chat, window].sum() > 0


def _cluster(tmp_path: Path) -> tuple[SimCluster, object]:
    sc = load_scenario(write(tmp_path, BASE.replace("16xH100-80GB:mig", "24xH100-80GB:mig"), "ok.yaml"))
    wl = build_workload(sc.build_trace(0.25), sc.specs)
    drain = np.full(len(wl.models), 30.0)
    cluster = SimCluster(sc.cluster, wl.models, wl.specs, drain_s=drain)
    _warm_start(cluster, wl, served_as(wl.specs), 10.0, CostAwarePacker())
    return cluster, wl


def test_node_loss_removes_replicas_and_capacity_at_once(tmp_path: Path) -> None:
    cluster, _ = _cluster(tmp_path)
    node = next(r.slot.node for reps in cluster.replicas for r in reps.values())
    before = sum(len(reps) for reps in cluster.replicas)
    on_node = sum(1 for reps in cluster.replicas for r in reps.values() if r.slot.node == node)
    routable = int(cluster.routable.sum())
    pool = cluster.pool_gpus
    out = apply_event(cluster, ClusterEvent(600.0, "node_lost", node), 600.0)
    assert out["replicas_lost"] == on_node > 0 and out["gpus_removed"] == 8 and out["nodes"] == [node]
    assert sum(len(reps) for reps in cluster.replicas) == before - on_node
    assert int(cluster.routable.sum()) == routable - on_node
    assert cluster.pool_gpus == pool - 8
    # nothing can be placed on the lost node any more
    for dev in range(8):
        assert all(owner.startswith("lost:") for owner, _ in cluster.inventory.device(node, dev).entries)
    assert not any(r.slot.node == node for reps in cluster.replicas for r in reps.values())


def test_node_loss_holding_a_team_takes_the_node_with_most_of_its_replicas(tmp_path: Path) -> None:
    text = BASE.replace("16xH100-80GB:mig", "24xH100-80GB:mig") + (
        "events:\n  - {at: 600, kind: node_lost, gpu_kind: H100-80GB, count: 1, holding: b}\n")
    sc = load_scenario(write(tmp_path, text, "ok.yaml"))
    (event,) = sc.cluster_events
    assert event.holding == ("fn",)  # team b's models
    cluster, _ = _cluster(tmp_path)
    held: dict[str, float] = {}
    for i, reps in enumerate(cluster.replicas):
        for r in reps.values():
            if cluster.models[i] == "fn":
                held[r.slot.node] = held.get(r.slot.node, 0.0) + r.slot.gpu_fraction
    out = apply_event(cluster, event, 600.0)
    assert out["nodes"] == [max(held, key=held.__getitem__)]


def test_gpu_kind_removed_takes_every_node_of_the_kind(tmp_path: Path) -> None:
    cluster, _ = _cluster(tmp_path)
    out = apply_event(cluster, ClusterEvent(0.0, "gpu_kind_removed", "H100-80GB"), 0.0)
    assert out["gpus_removed"] == 24 and len(out["nodes"]) == 3
    assert sum(len(reps) for reps in cluster.replicas) == 0 and cluster.pool_gpus == 0


def test_node_loss_fires_in_the_simulation(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, BASE.replace("16xH100-80GB:mig", "24xH100-80GB:mig"), "ok.yaml"))
    wl = build_workload(sc.build_trace(0.5), sc.specs)
    event = ClusterEvent(900.0, "node_lost", "H100-80GB", count=1)
    base = simulate(wl, sc.cluster, make_policy("slotwise"), SimConfig())
    hit = simulate(wl, sc.cluster, make_policy("slotwise"), SimConfig(events=(event,)))
    assert base.events == []
    [fired] = hit.events
    assert fired["at_s"] == 900.0 and fired["gpus_removed"] == 8 and fired["replicas_lost"] > 0
    assert hit.pool_gpus == base.pool_gpus - 8


def test_simulate_scenario_prints_per_team_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "card.json"
    rc = main(["simulate", "--scenario", "failure-day", "--hours", "0.6", "--policy", "slotwise",
               "--json", str(out_json)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "per team" in text and "search" in text and "assist" in text and "platform" in text
    assert "node_lost" in text and "replicas lost" in text
    import json

    doc = json.loads(out_json.read_text())
    # without --arbitration: the scenario's own mode (slo: the file has no arbitration block)
    assert [r["label"] for r in doc["runs"]] == ["slotwise/slo"]
    rows = doc["per_team"]["slotwise/slo"]
    assert {r["team"] for r in rows} == {"search", "assist", "platform"}
    assert all(0.0 <= r["slo_attainment"] <= 1.0 for r in rows)
    [card] = doc["results"]
    assert card["policy"] == "slotwise/slo"
    assert sum(r["gpu_hours_allocated"] for r in rows) == pytest.approx(card["gpu_hours"])
    assert doc["overall"]["slotwise/slo"]["unreasoned"] == 0
    # the node loss at 00:29 is in the recovery table for the top-priority models, next to their cold start
    rec = doc["recovery"]["slotwise/slo"]
    assert {r["model"] for r in rec} == {"chat", "code"} and all(r["at_s"] == 29 * 60 for r in rec)
    assert all(r["cold_start_s"] == 60.0 for r in rec)
    assert "recovery of the highest-priority models" in text


def test_scenario_refuses_trace_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "balanced-day", "--cluster", "8xL4"]) != 0
    assert "--scenario declares" in capsys.readouterr().err


def test_warm_start_replicas_are_counted_for_their_model(tmp_path: Path) -> None:
    """The packer's per-model indexes (anti-affinity) see the replicas the run starts with, whatever their names."""
    cluster, wl = _cluster(tmp_path)
    inv = cluster.inventory
    for i, reps in enumerate(cluster.replicas):
        for rid in reps:
            assert inv.model_of(rid) == wl.models[i]
        assert inv.model_allocation_count(wl.models[i]) == len(reps)


def test_a_scenario_runs_with_the_exact_budget_given_and_reports_its_cuts(tmp_path: Path) -> None:
    # --exact-budget reaches a scenario's run (it was dropped there: both runs used the default). With a cut too
    # short for any solve, every exact attempt falls back to the packer and is counted; with a generous one none is.
    import json

    cards = {}
    for budget in ("0.000001", "30"):
        out = tmp_path / f"card-{budget}.json"
        scenario = str(Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "small-mig-busy.yaml")
        assert main(["simulate", "--scenario", scenario, "--hours", "0.5",
                     "--policy", "slotwise", "--exact-budget", budget, "--json", str(out)]) == 0
        [cards[budget]] = json.loads(out.read_text())["results"]
    assert cards["0.000001"]["exact_budget_exceeded"] > 0
    assert cards["30"]["exact_budget_exceeded"] == 0
