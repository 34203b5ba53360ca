"""``slotwise run``'s settings for issue 16's annotation safety: ``limits:`` (caps on every model's annotations) and
the team bindings in ``teams:`` (``namespaces``, ``max_priority``)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from autoscaler.api.spec import SpecLimits
from autoscaler.cli.main import build_parser
from autoscaler.cli.run import _limits, build_settings
from autoscaler.decision.arbitration import TeamQuota
from autoscaler.live.controller import Controller


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_teams_bind_namespaces_and_cap_priority(tmp_path: Path) -> None:
    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text("teams:\n"
                   "  - {name: search, guaranteed_gpus: 8, namespaces: [search-prod, search-dev], max_priority: 10}\n"
                   "  - {name: research, namespaces: research}\n")
    s = build_settings(_args("--config", str(cfg)))
    assert s.arbitration.teams == (TeamQuota("search", 8, None, ("search-prod", "search-dev"), 10),
                                   TeamQuota("research", 0.0, None, ("research",)))
    assert Controller(object(), s).core.arbitration.teams == s.arbitration.teams  # what admission reads


def test_the_limits_section_is_read_and_checked() -> None:
    data = {"limits": {"max_replicas": 5000, "max_time_slice_replicas": 48}}
    _limits(data)
    assert data["limits"] == SpecLimits(max_replicas=5000, max_time_slice_replicas=48)
    nothing: dict = {}
    _limits(nothing)
    assert nothing == {}  # absent: the controller's default (SpecLimits())


@pytest.mark.parametrize(("section", "message"), [
    ({"max_replicas": 0}, "limits.max_replicas must be a whole number in [1, 1e+09], got 0"),
    ({"max_rps": "lots"}, "limits.max_rps must be a number in [1, 1e+12], got 'lots'"),
    ({"max_replicaz": 5}, "unknown limits setting(s) max_replicaz"),
    ([5], "limits: expected a mapping of settings"),
])
def test_bad_limits_name_the_key(section: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _limits({"limits": section})


def test_the_limits_reach_the_decision_core(tmp_path: Path) -> None:
    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text("limits: {max_replicas: 5000, max_concurrency: 512}\n")
    s = build_settings(_args("--config", str(cfg)))
    assert Controller(object(), s).core.limits == SpecLimits(max_replicas=5000, max_concurrency=512)
    cfg.write_text("tick_s: 3\n")
    assert Controller(object(), build_settings(_args("--config", str(cfg)))).core.limits == SpecLimits()


def test_prometheus_auth_and_the_modes_are_read(tmp_path: Path) -> None:
    """``prometheus_auth:`` reaches the metrics window's client; ``--report`` is report mode, ``--dry-run`` writes
    nothing and takes no Lease (issue 16's security section)."""
    from autoscaler.live.prometheus.client import PrometheusAuth

    cfg = tmp_path / "slotwise.yaml"
    token = tmp_path / "token"
    token.write_text("secret\n")
    cfg.write_text(f"prometheus_url: https://prom.example:9090\nprometheus_auth: {{bearer_token_file: {token}}}\n")
    s = build_settings(_args("--config", str(cfg), "--report"))
    assert s.prometheus_auth == PrometheusAuth(bearer_token_file=str(token))
    assert s.actuator.report_only and not s.actuator.dry_run
    ctl = Controller(object(), s)
    assert ctl.prometheus is not None and ctl.prometheus.client.auth == s.prometheus_auth
    assert ctl.elects and ctl.lender.dry_run  # report mode: it leads, but lends and evicts nothing
    dry = Controller(object(), build_settings(_args("--dry-run")))
    assert not dry.elects and dry.gate.open()  # plans every tick, takes no Lease
    cfg.write_text("prometheus_auth: {bearer_tokn: x}\n")
    with pytest.raises(ValueError, match="unknown prometheus_auth setting"):
        build_settings(_args("--config", str(cfg)))
