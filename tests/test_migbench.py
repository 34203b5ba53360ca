"""mig-bench: one small and one large instance end to end, and the CLI's argument handling."""

from __future__ import annotations

import json

import pytest

from autoscaler.commands import migbench as cmd
from sharing.migbench import run_instance


def test_small_instance_against_milp() -> None:
    row = run_instance("h100-8", 3)
    assert row["bound_method"] == "milp" and row["bound_optimal"]
    for p in ("first-fit", "cost-aware"):
        assert row[p]["gpus"] >= row["bound_gpus"]  # a lower bound really is one
    assert row["cost-aware"]["anti_affinity_violations"] == 0
    assert row["relayout"]["moves"] <= row["relayout"]["max_moves"]


def test_cli_json(tmp_path, capsys) -> None:
    out = tmp_path / "m.json"
    assert cmd.main(["--scenarios", "h200-8", "--seeds", "1-2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 2 and {s["packer"] for s in data["summary"]} >= {"first-fit", "cost-aware"}
    assert "re-layout" in capsys.readouterr().out
    with pytest.raises(ValueError):
        cmd.main(["--scenarios", "nope"])
