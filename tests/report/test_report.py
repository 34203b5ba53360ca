"""``slotwise report`` end to end: from a real short simulation's JSON and from a REAL Prometheus (Debian's binary)
with the exported cost, request and gauge series backfilled by promtool; json/html/png carry the same numbers;
bad inputs are one line and exit 2."""

from __future__ import annotations

import argparse
import asyncio
import base64
import html
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest

from autoscaler.cli import main as cli
from autoscaler.cli import report as report_cmd
from autoscaler.live.prometheus.report import read_report
from autoscaler.report.prometheus import section_from_prometheus

# the real-Prometheus fixture (helpers imported inside functions, after pytest has loaded the plugin)
pytest_plugins = ("realparts.prometheus",)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEAMS = {"conv": "assistants", "code": "developer-tools"}


def slotwise(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """``slotwise ARGV`` through ``cli.main`` (its exit-2 handling included), with ``report`` registered even
    before cli.py registers it itself."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "report" not in sub.choices:
        report_cmd.register(sub)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return cli.main(argv)


# ------------------------------------------------------------------------------------------------ simulation


@pytest.fixture(scope="module")
def sim_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sim")
    models = d / "models.yaml"
    models.write_text("models:\n" + "".join(f"  {m}:\n    team: {t}\n" for m, t in TEAMS.items()))
    out = d / "sim.json"
    rc = cli.main(["simulate", "--trace", "azure-llm-2023", "--hours", "0.1", "--policy", "slotwise,hpa",
                   "--models", str(models), "--json", str(out)])
    assert rc == 0
    return out


def cards(path: Path) -> list[dict]:
    return json.loads(path.read_text())["results"]


def test_the_simulation_json_carries_cost_that_adds_up_to_gpu_hours(sim_json: Path) -> None:
    for card in cards(sim_json):
        cost = card["cost"]
        per_model = card["per_model"]
        assert set(per_model) == set(TEAMS)
        assert {m: pm["team"] for m, pm in per_model.items()} == TEAMS
        # gpu_hours counts GPU-equivalents held (slot.gpu_fraction), the same unit the models are charged in
        assert sum(pm["gpu_hours"] for pm in per_model.values()) == pytest.approx(card["gpu_hours"], rel=1e-9)
        for pm in per_model.values():
            assert sum(pm["gpu_hours_by_kind"].values()) == pytest.approx(pm["gpu_hours"])
            assert pm["cost_usd"] == pytest.approx(
                sum(h * cost["prices_usd_per_gpu_hour"][k] for k, h in pm["gpu_hours_by_kind"].items()))
            assert 0 <= pm["late_requests"] <= pm["requests"]
            assert 0 <= pm["violating_requests"] <= pm["requests"]
        assert card["serving_cost_usd"] == pytest.approx(sum(pm["cost_usd"] for pm in per_model.values()))
        assert card["cost_usd"] == card["serving_cost_usd"] + card["idle_cost_usd"]
        assert card["gpu_hours"] > 0 and card["cost_usd"] > 0
        assert {t: v["models"] for t, v in cost["by_team"].items()} == {t: [m] for m, t in TEAMS.items()}
        # held + idle never exceeds the cluster's GPUs over the scored period
        assert cost["total_gpu_hours"] <= card["gpus_total"] * cost["hours"] + 1e-9
        assert cost["idle_gpu_hours"] >= 0 and card["idle_cost_usd"] >= 0
        assert card["lent_gpu_hours"] == 0.0 and cost["lent_value_usd"] == 0.0


def test_report_from_a_simulation_writes_json_html_png_with_the_numbers(
    sim_json: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    assert slotwise(["report", "--sim", str(sim_json), "--out", str(out)], monkeypatch) == 0
    printed = capsys.readouterr().out
    for text in ("cost per team", "cost per model", "idle cost", "lent value", "SLO attainment",
                 "fragmentation", *TEAMS, *TEAMS.values()):
        assert text in printed, text

    rep = json.loads((out / "report.json").read_text())
    assert rep["source"] == "simulation"
    by_policy = {s["policy"]: s for s in rep["sections"]}
    assert list(by_policy) == ["slotwise", "hpa"]
    for card in cards(sim_json):
        s = by_policy[card["policy"]]
        # the scorecard's fields, as they are in the JSON
        for key in ("cost_usd", "serving_cost_usd", "idle_cost_usd", "gpu_hours", "idle_gpu_hours", "fragmentation",
                    "slo_minutes_met", "requests", "slo_attainment", "requests_within_latency"):
            assert s[key] == card[key], key
        assert s["lent_value_usd"] == 0.0 and any("lent value is 0" in n for n in s["notes"])
        models = {m["model"]: m for m in s["models"]}
        for name, pm in card["per_model"].items():
            assert models[name]["team"] == TEAMS[name]
            for key in ("cost_usd", "slo_attainment", "requests_within_latency", "latency_at_slo_percentile_s"):
                assert models[name][key] == pm[key], (name, key)
        teams = {t["team"]: t for t in s["teams"]}
        assert set(teams) == set(TEAMS.values())
        for name, team in TEAMS.items():
            assert teams[team]["cost_usd"] == pytest.approx(card["per_model"][name]["cost_usd"])
        assert sum(t["cost_share"] for t in s["teams"]) == pytest.approx(1.0)
        # most expensive first
        assert [t["cost_usd"] for t in s["teams"]] == sorted((t["cost_usd"] for t in s["teams"]), reverse=True)

    png = (out / "report.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 5000
    page = (out / "report.html").read_text()
    embedded = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert embedded and base64.b64decode(embedded.group(1)) == png  # self-contained: the same figure inline
    assert not re.search(r"""(src|href)=['"]?https?:""", page)  # nothing fetched from elsewhere
    slotwise_section = by_policy["slotwise"]
    for text in (*TEAMS, *TEAMS.values(), f"${slotwise_section['cost_usd']:,.2f}", "idle cost"):
        assert text in page, text


def test_price_overrides_reprice_the_simulation(sim_json: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rep"
    rc = slotwise(["report", "--sim", str(sim_json), "--price", "NVIDIA-H100-80GB-HBM3=1.25", "--out", str(out)],
                  monkeypatch)
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    for card, s in zip(cards(sim_json), rep["sections"], strict=True):
        assert set(card["cost"]["prices_usd_per_gpu_hour"]) == {"H100-80GB"}  # the default cluster
        assert s["prices_usd_per_gpu_hour"]["H100-80GB"] == 1.25
        assert s["serving_cost_usd"] == pytest.approx(card["gpu_hours"] * 1.25)
        assert s["idle_cost_usd"] == pytest.approx(card["cost"]["idle_gpu_hours"] * 1.25)
        assert s["cost_usd"] == s["serving_cost_usd"] + s["idle_cost_usd"]


# ------------------------------------------------------------------------------------------------ Prometheus

SCRAPE_S = 15
END = math.floor(time.time() / 60) * 60 - 120  # the newest backfilled sample
START = END - 3 * 3600
HOURS = 2.0
LEADER = {"instance": "slotwise-0:8080", "job": "slotwise"}
STANDBY = {"instance": "slotwise-1:8080", "job": "slotwise"}
PRICES = {"H100-80GB": 3.5, "A100-80GB": 2.0}
# (team, namespace, model, gpu_model, GPU-equivalents held)
HELD = [("search", "prod", "prod/ranker", "H100-80GB", 2.0), ("search", "prod", "prod/embed", "H100-80GB", 3 / 7),
        ("chat", "chat", "chat/llm", "A100-80GB", 1.0)]
IDLE = {"H100-80GB": 4 / 7, "A100-80GB": 0.0}
RPS = {"prod/ranker": (10.0, 0.1), "prod/embed": (5.0, 0.0), "chat/llm": (2.0, 0.2)}  # (requests/s, late/s)


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def _counter(family: str, series: list[tuple[dict[str, str], float]]) -> list[str]:
    """Counters growing at a constant rate per series, from 1000 (rate() stops its extrapolation at zero)."""
    lines = [f"# HELP {family} x", f"# TYPE {family} counter"]
    for labels, rate in series:
        value = 1000.0
        for t in range(START, END + 1, SCRAPE_S):
            if t > START:
                value += rate * SCRAPE_S
            lines.append(f"{family}_total{_labels(labels)} {value!r} {t}")
    return lines


def _gauge(family: str, series: list[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {family} x", f"# TYPE {family} gauge"]
    for labels, value in series:
        lines.extend(f"{family}{_labels(labels)} {value!r} {t}" for t in range(START, END + 1, SCRAPE_S))
    return lines


def openmetrics(leader_series: bool = True) -> str:
    lines = _counter("slotwise_gpu_slot_seconds", [
        ({"team": t, "namespace": ns, "model": m, "gpu_model": k, **LEADER}, g) for t, ns, m, k, g in HELD])
    lines += _counter("slotwise_gpu_cost_dollars", [
        ({"team": t, "namespace": ns, "model": m, **LEADER}, g * PRICES[k] / 3600) for t, ns, m, k, g in HELD])
    lines += _counter("slotwise_gpu_idle_seconds", [({"gpu_model": k, **LEADER}, v) for k, v in IDLE.items()])
    lines += _counter("slotwise_requests", [({"model": m, **LEADER}, r) for m, (r, _) in RPS.items()])
    lines += _counter("slotwise_requests_late", [({"model": m, **LEADER}, late) for m, (_, late) in RPS.items()])
    lines += _gauge("slotwise_gpu_price_dollars_per_hour", [({"gpu_model": k, **LEADER}, p) for k, p in PRICES.items()])
    lines += _gauge("slotwise_slo_objective_ratio", [({"model": m, **LEADER}, 0.95) for m in RPS])
    # the standby keeps the stale gauges of its last leadership: they must not count
    lines += _gauge("slotwise_fragmentation_ratio", [(LEADER, 0.25), (STANDBY, 0.9)])
    lines += _gauge("slotwise_gpu_slots", [({"gpu_model": "H100-80GB", "state": "lent", **LEADER}, 0.5),
                                           ({"gpu_model": "H100-80GB", "state": "lent", **STANDBY}, 3.0)])
    if leader_series:
        lines += _gauge("slotwise_is_leader", [(LEADER, 1.0), (STANDBY, 0.0)])
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prom(prometheus_factory):  # type: ignore[no-untyped-def]
    return prometheus_factory(openmetrics())


def test_report_from_prometheus_reads_the_exported_series(
    prom, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
) -> None:
    out = tmp_path / "rep"
    rc = slotwise(["report", "--prometheus", prom.url, "--hours", str(HOURS), "--end", str(END), "--out", str(out)],
                  monkeypatch)
    assert rc == 0
    printed = capsys.readouterr().out
    assert "prod/ranker" in printed and "search" in printed
    rep = json.loads((out / "report.json").read_text())
    assert rep["source"] == "prometheus" and rep["end"] == END
    (s,) = rep["sections"]
    models = {m["model"]: m for m in s["models"]}
    assert set(models) == {m for _, _, m, _, _ in HELD}
    for team, ns, model, kind, gpus in HELD:
        m = models[model]
        assert (m["team"], m["namespace"]) == (team, ns)
        assert m["gpu_hours_by_kind"] == {kind: pytest.approx(gpus * HOURS, rel=1e-6)}
        assert m["cost_usd"] == pytest.approx(gpus * HOURS * PRICES[kind], rel=1e-6)
        rps, late = RPS[model]
        assert m["requests"] == pytest.approx(rps * HOURS * 3600, rel=1e-6)
        assert m["requests_within_latency"] == pytest.approx(1 - late / rps, rel=1e-5)
        assert m["slo_attainment"] is None  # not in the counters: it needs per-minute counts
        assert m["slo_percentile"] == pytest.approx(95.0)
        assert isinstance(m["requests"], int) and isinstance(m["late_requests"], int)
    teams = {t["team"]: t for t in s["teams"]}
    assert teams["search"]["cost_usd"] == pytest.approx((2.0 + 3 / 7) * HOURS * 3.5, rel=1e-6)
    assert teams["chat"]["cost_usd"] == pytest.approx(HOURS * 2.0, rel=1e-6)
    assert s["idle_gpu_hours_by_kind"]["H100-80GB"] == pytest.approx(4 / 7 * HOURS, rel=1e-6)
    assert s["idle_cost_usd"] == pytest.approx(4 / 7 * HOURS * 3.5, rel=1e-6)
    # the leader's gauges, not the standby's stale ones
    assert s["fragmentation"] == pytest.approx(0.25)
    assert s["lent_gpu_hours"] == pytest.approx(0.5 * HOURS)
    assert s["lent_value_usd"] == pytest.approx(0.5 * HOURS * 3.5)
    assert s["prices_usd_per_gpu_hour"] == pytest.approx(PRICES)
    total_req = sum(r for r, _ in RPS.values()) * HOURS * 3600
    assert s["requests_within_latency"] == pytest.approx(
        1 - sum(late for _, late in RPS.values()) * HOURS * 3600 / total_req, rel=1e-5)
    assert s["slo_attainment"] is None
    assert s["cost_usd"] == s["serving_cost_usd"] + s["idle_cost_usd"]
    assert (out / "report.png").read_bytes()[:8] == PNG_MAGIC
    assert "chat/llm" in (out / "report.html").read_text()


def test_prometheus_report_reprices_with_overrides(prom, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rep"
    rc = slotwise(["report", "--prometheus", prom.url, "--hours", str(HOURS), "--end", str(END), "--price", "H100=1",
                   "--out", str(out)], monkeypatch)
    assert rc == 0
    (s,) = json.loads((out / "report.json").read_text())["sections"]
    models = {m["model"]: m for m in s["models"]}
    assert models["prod/ranker"]["cost_usd"] == pytest.approx(2.0 * HOURS * 1.0, rel=1e-6)
    assert models["chat/llm"]["cost_usd"] == pytest.approx(1.0 * HOURS * 2.0, rel=1e-6)  # the exported A100 price
    assert s["idle_cost_usd"] == pytest.approx(4 / 7 * HOURS * 1.0, rel=1e-6)


def test_without_leader_series_gauges_come_from_all_replicas(prometheus_factory) -> None:  # type: ignore[no-untyped-def]
    server = prometheus_factory(openmetrics(leader_series=False))
    s = section_from_prometheus(asyncio.run(read_report(server.url, HOURS, END)))
    assert s.fragmentation == pytest.approx(0.9)  # max over replicas: the best it can do without a leader
    assert s.serving_cost_usd == pytest.approx((2.0 + 3 / 7) * HOURS * 3.5 + HOURS * 2.0, rel=1e-6)
    assert s.cost_usd == pytest.approx(s.serving_cost_usd + 4 / 7 * HOURS * 3.5, rel=1e-6)


# ------------------------------------------------------------------------------------------------ bad input


def _one_line_exit_2(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                     match: str) -> None:
    assert slotwise(argv, monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("slotwise: ") and re.search(match, err), err


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_exit_2(["report", "--sim", str(tmp_path / "nope.json")], monkeypatch, capsys, "cannot read")


@pytest.mark.parametrize(("content", "match"), [
    ("not json at all", "not JSON"),
    ('{"trace": "x"}', "not a slotwise simulation JSON"),
    ('{"results": [{"policy": "hpa", "per_model": {"m": {"requests": 1}}}]}', "no cost data"),
    ("[1, 2, 3]", "not a slotwise simulation JSON"),
])
def test_not_a_simulation_json(content: str, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.json"
    f.write_text(content)
    _one_line_exit_2(["report", "--sim", str(f)], monkeypatch, capsys, match)


@pytest.mark.parametrize(("price", "match"), [("H100", "KIND=USD"), ("H100=-2", "KIND=USD"),
                                              ("Z900=1", "unknown GPU kind")])
def test_bad_price(price: str, match: str, sim_json: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_exit_2(["report", "--sim", str(sim_json), "--price", price], monkeypatch, capsys, match)


def test_unreachable_prometheus(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from realparts.prometheus import free_port

    url = f"http://127.0.0.1:{free_port()}"
    _one_line_exit_2(["report", "--prometheus", url, "--hours", "1"], monkeypatch, capsys, "cannot reach Prometheus")


def test_prometheus_without_slotwise_series(prom, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # a range before the backfill: the server answers, but there is nothing of slotwise's in it
    _one_line_exit_2(["report", "--prometheus", prom.url, "--hours", "1", "--end", str(START - 7200)],
                     monkeypatch, capsys, "no slotwise cost or request series")


def test_bad_hours_and_end(prom, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                           capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_exit_2(["report", "--prometheus", prom.url, "--hours", "0"], monkeypatch, capsys, "--hours")
    _one_line_exit_2(["report", "--prometheus", prom.url, "--end", "yesterday"], monkeypatch, capsys, "--end")


def test_one_source_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as e:
        slotwise(["report"], monkeypatch)
    assert e.value.code == 2


# ------------------------------------------------------------------------ the scenario scorecard (issue 9)


def test_recovery_time_is_the_start_of_the_first_three_met_minutes() -> None:
    from autoscaler.report.scenario import recovery_time_s

    arrivals = np.full(10, 100.0)
    within = np.array([99, 99, 40, 50, 99, 90, 99, 99, 99, 99], dtype=float)  # objective 0.95
    # event at 2:30 (minute 2): minutes 2, 3 miss, 4 meets, 5 misses, 6-8 meet -> back at 6:00
    assert recovery_time_s(arrivals, within, 0.95, at_s=150.0) == pytest.approx(360.0 - 150.0)
    # the minutes start after a burn-in: minute j covers [start + 60 j, start + 60 (j + 1))
    assert recovery_time_s(arrivals, within, 0.95, at_s=300.0 + 150.0, start_s=300.0) == pytest.approx(210.0)
    # a model the event did not hurt recovers at once
    assert recovery_time_s(arrivals, np.full(10, 99.0), 0.95, at_s=150.0) == 0.0
    # minutes without requests miss nothing
    idle = arrivals.copy()
    idle[5] = 0.0
    assert recovery_time_s(idle, np.where(idle > 0, within, 0.0), 0.95, at_s=150.0) == pytest.approx(240.0 - 150.0)
    # never three met minutes in a row after the event: None
    assert recovery_time_s(arrivals, np.array([99, 99, 40, 99, 99, 50, 99, 99, 10, 99.0]), 0.95, at_s=150.0) is None
    assert recovery_time_s(arrivals, within, 0.95, at_s=8 * 60.0) is None  # too few minutes left to tell
    # an event before the first scored minute counts from the first minute
    assert recovery_time_s(arrivals, within, 0.95, at_s=0.0, start_s=120.0) == pytest.approx(120.0 + 360.0)


def _team_row(team: str, guaranteed: float, limit: float | None, cost: float) -> dict:
    """A row with the keys of autoscaler.sim.scorecard.team_card (hand-made: the rendering is tested alone)."""
    return {"team": team, "guaranteed_gpus": guaranteed, "borrowing_limit_gpus": limit, "models": [f"{team}-m"],
            "requests": 1000, "violating_requests": 12, "late_requests": 30, "slo_attainment": 0.988,
            "requests_within_latency": 0.97, "success_rate": 0.999, "gpu_hours_allocated": 4.0,
            "gpu_hours_busy": 3.0, "utilization_busy": 0.75, "cost_usd": cost, "replica_wait_minutes": 12.5,
            "shortfall_minutes_by_cause": {"borrowing_limit": 10.0, "preempting": 2.5},
            "refusals_within_guarantee": 0.0, "preemptions_by_reason": {"priority": 2}, "preemptions_caused": 0}


def _scenario_doc() -> dict:
    from types import SimpleNamespace

    from autoscaler.report.scenario import Run, build_doc

    runs = [Run("slotwise/slo", "slotwise", "slo"), Run("slotwise/partition", "slotwise", "partition")]
    arrivals = np.full((2, 10), 100.0)
    within = np.array([[99, 99, 99, 40, 60, 99, 99, 99, 99, 99], [99.0] * 10])
    results, cards, team_cards = [], [], []
    for k, r in enumerate(runs):
        results.append(SimpleNamespace(
            models=("chat", "fn"), minute_arrivals=arrivals, minute_within=within, burn_in_s=120.0,
            slo_percentile=np.array([95.0, 99.0]),
            events=[{"at_s": 300.0, "kind": "node_lost", "target": "h100-80gb-0", "count": None,
                     "nodes": ["h100-80gb-0"], "replicas_lost": 3, "gpus_removed": 8}],
            preemptions=[{"at_s": 330.0, "model": "fn", "team": "b", "replica": "fn-3", "by_model": "chat",
                          "reason": "priority", "message": "chat would miss its SLO"}]))
        cards.append({"policy": r.label, "requests": 2000.0, "gpus_total": 8, "lending": None,
                      "cost": {"hours": 10 / 60}})
        rows = [_team_row("a", 4.0, 2.0, 12.34 + k), _team_row("b", 2.0, None, 5.67 + k)]
        team_cards.append({"teams": rows, "all": {**_team_row("all", 6.0, None, 18.01 + 2 * k), "gpus_total": 8,
                                                   "fragmentation": 0.1, "serving_cost_usd": 16.51 + 2 * k,
                                                   "idle_cost_usd": 1.5,
                                                   "lent_gpu_hours": 0.0, "lent_value_usd": 0.0,
                                                   "training_jobs_started": 0, "training_jobs_completed": 0,
                                                   "training_wait_p50_s": None, "training_wait_p95_s": None,
                                                   "training_goodput_gpu_hours": 0.0, "unreasoned": 0}})
    return build_doc(meta={"scenario": "hand-made", "hours": 10 / 60}, runs=runs, results=results, cards=cards,
                     team_cards=team_cards, priorities={"chat": 100, "fn": 10}, cold_starts={"chat": 60.0, "fn": 5.0})


def test_scenario_doc_tables_and_html_carry_the_same_numbers(tmp_path: Path) -> None:
    from autoscaler.report.scenario import tables, write_report

    doc = _scenario_doc()
    assert list(doc["per_team"]) == ["slotwise/slo", "slotwise/partition"]
    assert doc["top_priority_models"] == ["chat"]
    # event at 5:00 = minute 3 after a 2-minute burn-in; minutes 3, 4 miss; back from minute 5 = 7:00
    [rec] = doc["recovery"]["slotwise/slo"]
    assert rec["model"] == "chat" and rec["recovery_s"] == pytest.approx(120.0) and rec["cold_start_s"] == 60.0
    assert rec["within_cold_start"] is False
    row = doc["per_team"]["slotwise/slo"][0]
    assert row["mean_gpus_allocated"] == pytest.approx(4.0 / (10 / 60)) and row["preempted"] == 2
    assert doc["overall"]["slotwise/slo"]["utilization_allocated"] == pytest.approx(4.0 / (8 * 10 / 60))

    by_title = {t.title.split(" (")[0]: t for t in tables(doc)}
    team = by_title["per team: quota, requests, SLO"]
    assert [r[:6] for r in team.rows] == [("slotwise/slo", "a", "4", "2", "24.00", "1"),
                                          ("slotwise/slo", "b", "2", "none", "24.00", "1"),
                                          ("slotwise/partition", "a", "4", "2", "24.00", "1"),
                                          ("slotwise/partition", "b", "2", "none", "24.00", "1")]
    cost = by_title["per team: GPU-hours, cost, waiting, preemptions"]
    assert [r[cost.header.index("cost")] for r in cost.rows] == ["$12.34", "$5.67", "$13.34", "$6.67"]
    causes = by_title["preemptions by reason and shortfall by cause"]
    # causes in ShortfallCause's order, the totals row per run
    assert causes.header[2:] == ("preempted: priority", "preempted: guarantee", "preemptions caused",
                                 "shortfall borrowing_limit (replica-min)", "shortfall preempting (replica-min)")
    assert [r[1] for r in causes.rows] == ["a", "b", "all", "a", "b", "all"]
    recovery = by_title["recovery of the highest-priority models"]
    assert recovery.rows[0] == ("slotwise/slo", "00:05", "node_lost", "chat", "60", "120", "no")

    paths = write_report(doc, str(tmp_path / "out"))
    assert (tmp_path / "out" / "scorecard.json").exists() and set(paths) == {"json", "png", "html"}
    saved = json.loads(Path(paths["json"]).read_text())
    png = Path(paths["png"]).read_bytes()
    assert png[:8] == PNG_MAGIC
    page = Path(paths["html"]).read_text()
    embedded = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert embedded and base64.b64decode(embedded.group(1)) == png
    # every cell of every table, rendered from the JSON as written, is in the page
    for t in tables(saved):
        for r in t.rows:
            assert "".join(f"<td>{html.escape(v)}</td>" for v in r) in page.replace("<td class=n>", "<td>"), r


def test_the_report_shows_the_cold_start_fields_a_scorecard_has(sim_json: Path) -> None:
    """Scale to zero's fields (issue 18) reach the report's summary with the scorecard's labels and numbers; a
    scorecard written before them still loads, without those rows."""
    from autoscaler.report.data import sections_from_simulation
    from autoscaler.report.render import summary_rows
    from autoscaler.sim.scorecard import LABELS

    doc = json.loads(sim_json.read_text())
    card = doc["results"][0]
    card.update(cold_started_requests=1234, cold_start_slo="exempt", warm_idle_gpu_hours=5.5)
    rows = dict(summary_rows(sections_from_simulation(doc)[0]))
    assert rows[LABELS["cold_started_requests"]] == "1,234"
    assert rows[LABELS["cold_start_slo"]] == "exempt"
    assert rows[LABELS["warm_idle_gpu_hours"]].startswith("5.5")
    for key in ("cold_started_requests", "cold_start_slo", "warm_idle_gpu_hours"):
        del card[key]
    rows = dict(summary_rows(sections_from_simulation(doc)[0]))
    assert LABELS["cold_started_requests"] not in rows
