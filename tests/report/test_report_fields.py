"""``slotwise simulate --json`` and ``slotwise report --sim`` say the same thing (issue 15, item 1): the JSON layout
is a list of scorecards for one policy or many; the report's numbers are the JSON's, field for field; the raw share
of requests within the latency target is never labelled "SLO attainment"; a file without a field the report reads
is one line naming the file and the field."""

from __future__ import annotations

import contextlib
import html
import io
import json
import re
from pathlib import Path

import pytest

from autoscaler.cli import simulate as simulate_cmd
from autoscaler.cli.main import main
from autoscaler.report import render, scenario
from autoscaler.report.data import CARD_FIELDS, MODEL_FIELDS
from autoscaler.sim.scorecard import COLUMNS, LABELS, LENDING_COLUMNS


def simulate(tmp: Path, policies: str) -> tuple[Path, str]:
    out = tmp / f"{policies.replace(',', '-')}.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["simulate", "--hours", "0.1", "--policy", policies, "--json", str(out)]) == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    d = tmp_path_factory.mktemp("sim")
    return {p: simulate(d, p) for p in ("hpa", "slotwise,hpa,kpa")}


@pytest.mark.parametrize(("policies", "n"), [("hpa", 1), ("slotwise,hpa,kpa", 3)])
def test_the_json_is_a_list_of_cards_and_the_report_reads_its_numbers(
    runs: dict[str, tuple[Path, str]], policies: str, n: int, tmp_path: Path
) -> None:
    path, _ = runs[policies]
    cards = json.loads(path.read_text())["results"]
    assert isinstance(cards, list) and [c["policy"] for c in cards] == policies.split(",")
    assert len(cards) == n
    out = tmp_path / "rep"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", "--sim", str(path), "--out", str(out)]) == 0
    sections = json.loads((out / "report.json").read_text())["sections"]
    assert [s["policy"] for s in sections] == [c["policy"] for c in cards]
    for card, s in zip(cards, sections, strict=True):
        for key in CARD_FIELDS:  # every field the two share: the JSON's value, exactly
            assert s[key] == card[key], (card["policy"], key, s[key], card[key])
        assert s["idle_gpu_hours_by_kind"] == card["cost"]["idle_gpu_hours_by_kind"]
        assert s["lent_value_usd"] == card["cost"]["lent_value_usd"]
        assert s["prices_usd_per_gpu_hour"] == card["cost"]["prices_usd_per_gpu_hour"]
        models = {m["model"]: m for m in s["models"]}
        assert set(models) == set(card["per_model"])
        for name, pm in card["per_model"].items():
            for key in MODEL_FIELDS:
                assert models[name][key] == pm[key], (name, key)
        # what is shown is what is stored: the summary's rows are formatted from these very fields
        shown = dict(render.summary_rows(_section(path, card["policy"])))
        assert shown[LABELS["slo_attainment"]] == render.pct(card["slo_attainment"])
        assert shown[LABELS["idle_reserved_gpu_hours"]] == render.hours(card["idle_reserved_gpu_hours"])
        assert shown["idle GPU-hours on nodes holding replicas"] == render.hours(card["idle_gpu_hours"])
        assert shown[LABELS["requests_within_latency"]] == render.pct(card["requests_within_latency"])


def _section(path: Path, policy: str):  # type: ignore[no-untyped-def]
    from autoscaler.report.data import load_simulation, sections_from_simulation

    return next(s for s in sections_from_simulation(load_simulation(str(path))) if s.policy == policy)


def test_counts_are_whole_and_noise_is_zero(runs: dict[str, tuple[Path, str]]) -> None:
    path, _ = runs["slotwise,hpa,kpa"]
    text = path.read_text()
    for card in json.loads(text)["results"]:
        for key in ("requests", "violating_requests", "unattainable_requests", "late_requests", "scale_events"):
            assert isinstance(card[key], int), key
        for pm in card["per_model"].values():
            assert all(isinstance(pm[k], int) for k in ("requests", "violating_requests", "late_requests"))
        assert card["idle_cost_usd"] <= card["cost_usd"] == card["serving_cost_usd"] + card["idle_cost_usd"]
    assert not re.search(r"\de-(1[0-9]|[2-9][0-9])\b", text), "float noise below 1e-9 is stored as 0"


def _rows_labelled_slo_attainment() -> list[tuple[str, str]]:
    """Every (label, field) pair of every table the scorecard and the reports print."""
    pairs = [(LABELS[k], k) for k in (*COLUMNS, *LENDING_COLUMNS)]
    pairs += [(label, key) for label, key, _ in render.SUMMARY_ROWS + render.TEAM_COLUMNS + render.MODEL_COLUMNS]
    pairs += [(label, key) for label, key, _ in scenario.TEAM_COLUMNS + scenario.TEAM_COST_COLUMNS
              + scenario.OVERALL_ROWS]
    return [(label, key) for label, key in pairs if "slo attainment" in label.lower()]


def test_the_raw_share_is_never_labelled_slo_attainment(runs: dict[str, tuple[Path, str]]) -> None:
    labelled = _rows_labelled_slo_attainment()
    assert ("SLO attainment: requests in SLO-meeting model-minutes", "slo_attainment") in labelled
    assert {key for _, key in labelled} <= {"slo_attainment", "slo_attainment_attainable", "summed_slo_attainment"}
    # and as printed: the row with the field requests_within_latency does not say "SLO attainment", the headline is
    # the first row
    _, printed = runs["slotwise,hpa,kpa"]
    lines = [ln for ln in printed.splitlines() if "│" in ln]
    assert "slo_attainment " in lines[0] and "SLO attainment" in lines[0]
    raw = [ln for ln in lines if "requests_within_latency" in ln]
    assert raw and not any("SLO attainment" in ln for ln in raw)
    rows = simulate_cmd.table_rows(json.loads(runs["hpa"][0].read_text())["results"])
    assert rows[0][1] == "slo_attainment"
    assert all("SLO attainment" not in label for label, key, _ in rows if key == "requests_within_latency")


def test_the_page_shows_the_headline_under_its_label(runs: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    path, _ = runs["hpa"]
    out = tmp_path / "rep"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", "--sim", str(path), "--out", str(out)]) == 0
    (card,) = json.loads(path.read_text())["results"]
    page = (out / "report.html").read_text()
    label = html.escape(LABELS["slo_attainment"])
    assert f"<td>{label}</td><td class=n>{render.pct(card['slo_attainment'])}</td>" in page
    raw = html.escape(LABELS["requests_within_latency"])
    assert f"<td>{raw}</td><td class=n>{render.pct(card['requests_within_latency'])}</td>" in page


@pytest.mark.parametrize(("edit", "field"), [
    (lambda c: c.pop("slo_minutes_met"), "'slo_minutes_met'"),
    (lambda c: c.pop("serving_cost_usd"), "'serving_cost_usd'"),
    (lambda c: c["cost"].pop("lent_value_usd"), "'cost.lent_value_usd'"),
    (lambda c: next(iter(c["per_model"].values())).pop("latency_at_slo_percentile_s"),
     r"'per_model\.\w+\.latency_at_slo_percentile_s'"),
])
def test_a_file_without_a_field_names_the_file_and_the_field(
    runs: dict[str, tuple[Path, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, field: str  # type: ignore[no-untyped-def]
) -> None:
    doc = json.loads(runs["hpa"][0].read_text())
    edit(doc["results"][0])
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps(doc))
    assert main(["report", "--sim", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and re.search(field, err), err


def test_an_old_single_card_layout_is_named(runs: dict[str, tuple[Path, str]], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(runs["hpa"][0].read_text())
    doc["results"] = doc["results"][0]
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps(doc))
    assert main(["report", "--sim", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a list" in err
