"""``slotwise simulate --cold-start-slo`` (issue 18): the option reaches the run and the scorecard states it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from autoscaler.cli.main import main


@pytest.mark.parametrize("how", ["count", "exempt"])
def test_the_scorecard_states_how_cold_started_requests_were_judged(tmp_path: Path, how: str) -> None:
    out = tmp_path / "card.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["simulate", "--hours", "0.1", "--policy", "hpa", "--cold-start-slo", how,
                     "--json", str(out)]) == 0
    card = json.loads(out.read_text())["results"][0]
    assert card["cold_start_slo"] == how
    assert 0 <= card["cold_started_requests"] <= card["requests"]
    assert card["slo_judged_requests"] == card["requests"] - (card["cold_started_requests"] if how == "exempt" else 0)
    if how == "exempt":
        assert card["gpu_hours_vs_lower_bound"] is None and card["lower_bound_comparable"] is False
        assert "cold-started requests exempt" in printed.getvalue()
        assert "cold_start_slo" in printed.getvalue()  # the table says it too


def test_an_unknown_cold_start_slo_is_refused() -> None:
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as e:
        main(["simulate", "--cold-start-slo", "ignore"])
    assert e.value.code == 2
