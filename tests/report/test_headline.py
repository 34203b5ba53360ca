"""The headline ``slotwise simulate`` prints first (autoscaler/report/headline.py): GPU-hours at the SLO, slotwise's
saving or loss against each policy said as what it is, misses marked, the lower bound and the HPA-defaults target --
and never a word the scorecards' numbers contradict."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoscaler.report.headline import (
    SLO_OBJECTIVE,
    at_slo_line,
    attainment_pct,
    change_pct,
    defaults_line,
    headline,
    lower_bound_lines,
    meets_objective,
    policy_lines,
)
from autoscaler.sim.harness import POLICY_ORDER

REQUESTS = 100_000


def card(policy: str, gpu_hours: float, violating: int, requests: int = REQUESTS, **extra: Any) -> dict[str, Any]:
    return {"policy": policy, "gpu_hours": gpu_hours, "violating_requests": violating, "requests": requests,
            "slo_attainment": (requests - violating) / requests if requests else 1.0,
            "unattainable_requests": 0, "lower_bound_gpu_hours": None, "gpu_hours_vs_lower_bound": None,
            "cost": {"hours": 24.0}, **extra}


def row(lines: list[str], policy: str) -> str:
    (hit,) = [ln for ln in lines if ln.split()[:1] == [policy]]
    return hit


def test_rows_follow_policy_order_and_say_saving_and_loss() -> None:
    cards = [card("static", 6.875, 100), card("hpa", 10.0, 250), card("slotwise", 7.7, 50)]
    lines = policy_lines(cards)
    assert [ln.split()[0] for ln in lines[1:]] == ["slotwise", "hpa", "static"]
    assert "slotwise uses 23% fewer GPU-hours than hpa and has 80% fewer violating requests" in row(lines, "hpa")
    assert "slotwise uses 12% MORE GPU-hours than static, with 50% fewer violating requests" in row(lines, "static")
    assert "slotwise uses" not in row(lines, "slotwise")  # no comparison with itself


def test_a_saving_bought_with_violations_is_said_so() -> None:
    lines = policy_lines([card("slotwise", 8.0, 3_000), card("kpa", 10.0, 1_000), card("hpa", 4.0, 0)])
    assert "slotwise uses 20% fewer GPU-hours than kpa but has 3.0x as many violating requests" in row(lines, "kpa")
    assert "slotwise uses 2.0x the GPU-hours of hpa and has 3,000 violating requests where hpa has none" in row(
        lines, "hpa")


def test_misses_are_marked_with_their_attainment() -> None:
    lines = policy_lines([card("slotwise", 5.0, 100), card("static", 9.0, 5_900)])
    assert re.search(r"static\s+9\.00\s+94\.1%\s+5,900\s+misses its SLO;", row(lines, "static"))
    assert re.search(r"slotwise\s+5\.00\s+99\.9%\s+100\s+meets its SLO", row(lines, "slotwise"))


def test_the_oracle_is_a_reference() -> None:
    lines = policy_lines([card("slotwise", 5.0, 0), card("oracle", 4.0, 0)])
    assert "a reference (per-tick, zero cold start; not a bound)" in row(lines, "oracle")
    assert at_slo_line([card("slotwise", 5.0, 0), card("oracle", 4.0, 0)]) == (
        "at the SLO: slotwise is the only policy that meets the objective")


def test_at_the_slo_compares_only_policies_that_meet_it() -> None:
    meets = [card("slotwise", 7.5, 10), card("hpa", 10.0, 20), card("kpa", 5.0, 9_000)]
    assert at_slo_line(meets) == "at the SLO (slotwise, hpa meet it): slotwise needs 25% fewer GPU-hours than hpa"
    three = [*meets, card("static", 15.0, 0), card("predictive", 7.5, 30)]
    assert at_slo_line(three) == ("at the SLO (slotwise, predictive, hpa, static meet it): slotwise needs the same "
                                  "GPU-hours as predictive, 25% fewer GPU-hours than hpa and 50% fewer GPU-hours "
                                  "than static")
    missing = [card("slotwise", 7.5, 900), card("static", 9.0, 10)]
    assert at_slo_line(missing) == "at the SLO: slotwise misses the objective (99.1%); meeting it: static"
    assert at_slo_line([card("slotwise", 7.5, 900), card("hpa", 9.0, 2_000)]).startswith(
        "at the SLO: no policy meets the objective in this run")


def test_attainment_never_prints_across_the_objective_or_as_all() -> None:
    assert attainment_pct(0.99496) == "99.49%"
    assert attainment_pct(0.995) == "99.5%"
    assert attainment_pct(0.99999) == "99.99%"
    assert attainment_pct(1.0) == "100%"
    assert attainment_pct(0.8946) == "89.5%"  # as the table's 0.8946 reads
    assert change_pct(0.996) == "99%" and change_pct(0.004) == "0.4%" and change_pct(0.0004) == "<0.1%"


def test_lower_bound_line_when_the_card_has_one() -> None:
    assert lower_bound_lines([card("slotwise", 5.0, 0)]) == []
    with_bound = card("slotwise", 5.24, 0, lower_bound_gpu_hours=4.0, gpu_hours_vs_lower_bound=1.31,
                      unattainable_requests=2_000, slo_attainment_attainable=0.999)
    assert lower_bound_lines([with_bound]) == [
        "lower bound (clairvoyant, with cold start): 4.00 GPU-h; slotwise at 1.31x",
        "2,000 requests (2%) are in model-minutes no schedule can meet; '(attainable)' is the SLO attainment over "
        "the others",
    ]
    assert policy_lines([with_bound])[1].endswith("(99.9%)  meets its SLO")


def test_hpa_defaults_target_says_which_case() -> None:
    assert defaults_line([card("slotwise", 5.0, 10)]) is None
    assert defaults_line([card("slotwise", 5.0, 10), card("hpa", 6.0, 5)]).endswith("met: no more GPU-hours")
    assert defaults_line([card("slotwise", 7.0, 10), card("hpa", 6.0, 50)]).endswith(
        "met: more GPU-hours, but fewer violating requests")
    # 0.1 % more is more: the target is about exact numbers
    assert defaults_line([card("slotwise", 6.006, 50), card("hpa", 6.0, 50)]).endswith(
        "MISSED: more GPU-hours and no fewer violating requests")


def test_headline_starts_with_the_objective() -> None:
    lines = headline([card("hpa", 6.0, 50), card("slotwise", 5.0, 10)])
    assert lines[0] == ("GPU-hours each policy needs at its SLO (objective: >= 99.5% of requests in SLO-meeting "
                        "model-minutes; 24 h scored)")
    assert headline([]) == []


_cards = st.lists(
    st.tuples(st.floats(0.0, 500.0, allow_nan=False), st.integers(0, 2_000), st.integers(1, 200_000)),
    min_size=1, max_size=len(POLICY_ORDER),
).map(lambda xs: [card(p, g, min(v, r), r) for p, (g, v, r) in zip(POLICY_ORDER, xs, strict=False)])


@given(_cards)
def test_no_word_contradicts_the_numbers(cards: list[dict[str, Any]]) -> None:
    lines = headline(cards)
    by = {c["policy"]: c for c in cards}
    me = by.get("slotwise")
    for c in cards:
        text = row(lines, c["policy"])
        assert ("meets its SLO" in text) == meets_objective(c) == (c["slo_attainment"] >= SLO_OBJECTIVE)
        shown = float(re.search(r"([\d.]+)%", text.split()[2]).group(1)) / 100.0  # the "in SLO" column
        assert abs(shown - c["slo_attainment"]) <= 0.0005 + 1e-12
        assert (shown >= SLO_OBJECTIVE) == meets_objective(c) or text.split()[2].startswith("<")
        assert f"{c['violating_requests']:,}" in text
        if me is None or c is me:
            continue
        name = c["policy"]
        if f"fewer GPU-hours than {name}" in text:
            assert me["gpu_hours"] < c["gpu_hours"]
        if f"MORE GPU-hours than {name}" in text or f"the GPU-hours of {name}" in text:
            assert me["gpu_hours"] > c["gpu_hours"]
        if "fewer violating requests" in text or f"no violating requests ({name} has" in text:
            assert me["violating_requests"] < c["violating_requests"]
        if "MORE violating" in text or "as many violating requests" in text.replace("as many violating requests (",
                                                                                    ""):
            assert me["violating_requests"] > c["violating_requests"]
    if me is not None and "hpa" in by:
        no_more = me["gpu_hours"] <= by["hpa"]["gpu_hours"] + 1e-9  # float noise is the scorecard's EPS
        target = no_more or me["violating_requests"] < by["hpa"]["violating_requests"]
        assert ("MISSED" in lines[-1]) == (not target)


def test_simulate_prints_the_headline_before_the_table(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from autoscaler.cli.main import main

    out_json = tmp_path / "o.json"
    assert main(["simulate", "--hours", "0.1", "--policy", "hpa,slotwise", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    cards = json.loads(out_json.read_text())["results"]
    assert printed.startswith("\n".join(headline(cards)) + "\n\n")
    assert printed.index("GPU-hours each policy needs at its SLO") < printed.index("slotwise simulate —")
    assert "slo_attainment" in printed  # the table is still there
    assert "vs hpa at its defaults" in printed
