"""``slotwise report`` end to end: from a real short simulation's JSON and from a REAL Prometheus (Debian's binary)
with the exported cost, request and gauge series backfilled by promtool; json/html/png carry the same numbers;
bad inputs are one line and exit 2."""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import time
from pathlib import Path

import pytest

from autoscaler import cli
from autoscaler.commands import report as report_cmd

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
    res = json.loads(path.read_text())["results"]
    return res if isinstance(res, list) else [res]


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
        assert card["cost_usd"] == pytest.approx(sum(pm["cost_usd"] for pm in per_model.values()))
        assert card["gpu_hours"] > 0 and card["cost_usd"] > 0
        assert {t: v["models"] for t, v in cost["by_team"].items()} == {t: [m] for m, t in TEAMS.items()}
        # held + idle never exceeds the cluster's GPUs over the scored period
        assert cost["gpu_hours"] + cost["idle_gpu_hours"] <= card["gpus_total"] * cost["hours"] + 1e-9
        assert cost["idle_gpu_hours"] >= 0 and card["idle_cost_usd"] >= 0
        assert card["lent_gpu_hours"] == 0.0 and cost["lent_usd"] == 0.0


def test_report_from_a_simulation_writes_json_html_png_with_the_numbers(
    sim_json: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    assert slotwise(["report", "--sim", str(sim_json), "--out", str(out)], monkeypatch) == 0
    printed = capsys.readouterr().out
    for text in ("cost per team", "cost per model", "idle reserved cost", "lent value", "SLO attainment",
                 "fragmentation", *TEAMS, *TEAMS.values()):
        assert text in printed, text

    rep = json.loads((out / "report.json").read_text())
    assert rep["source"] == "simulation"
    by_policy = {s["policy"]: s for s in rep["sections"]}
    assert list(by_policy) == ["slotwise", "hpa"]
    for card in cards(sim_json):
        s = by_policy[card["policy"]]
        assert s["cost_usd"] == pytest.approx(card["cost_usd"])
        assert s["gpu_hours"] == pytest.approx(card["gpu_hours"])
        assert s["idle_cost_usd"] == pytest.approx(card["idle_cost_usd"])
        assert s["lent_value_usd"] == 0.0 and any("lent value is 0" in n for n in s["notes"])
        assert s["fragmentation"] == pytest.approx(card["fragmentation"])
        assert s["slo_windows_met"] == pytest.approx(card["slo_windows_met"])
        assert s["requests"] == pytest.approx(card["requests"])
        assert s["slo_attainment"] == pytest.approx(card["slo_attainment"])
        models = {m["model"]: m for m in s["models"]}
        for name, pm in card["per_model"].items():
            assert models[name]["cost_usd"] == pytest.approx(pm["cost_usd"])
            assert models[name]["team"] == TEAMS[name]
            assert models[name]["slo_attainment"] == pytest.approx(pm["slo_attainment"])
            assert models[name]["p95_latency_s"] == pytest.approx(pm["p95_latency_s"])
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
    for text in (*TEAMS, *TEAMS.values(), f"${slotwise_section['cost_usd']:,.2f}", "idle reserved cost"):
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
        assert s["cost_usd"] == pytest.approx(card["gpu_hours"] * 1.25)
        assert s["idle_cost_usd"] == pytest.approx(card["cost"]["idle_gpu_hours"] * 1.25)


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
        assert m["slo_attainment"] == pytest.approx(1 - late / rps, rel=1e-6)
        assert m["slo_objective"] == pytest.approx(0.95)
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
    assert s["slo_attainment"] == pytest.approx(1 - sum(late for _, late in RPS.values()) * HOURS * 3600 / total_req,
                                                rel=1e-6)
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
    from autoscaler.report.prometheus import section_from_prometheus

    server = prometheus_factory(openmetrics(leader_series=False))
    s = section_from_prometheus(server.url, HOURS, end=END)
    assert s.fragmentation == pytest.approx(0.9)  # max over replicas: the best it can do without a leader
    assert s.cost_usd == pytest.approx((2.0 + 3 / 7) * HOURS * 3.5 + HOURS * 2.0, rel=1e-6)


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
