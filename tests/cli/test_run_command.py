"""``slotwise run``: where the cluster comes from, and the settings file's errors."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest

from autoscaler.cli.main import build_parser, main
from autoscaler.cli.run import build_settings
from autoscaler.decision.arbitration import ArbitrationPolicy, TeamQuota
from autoscaler.live.controller import Controller


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_without_a_cluster_it_says_so_and_points_to_simulate(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert "no Kubernetes cluster" in err and "slotwise simulate" in err


def test_a_missing_kubeconfig_is_named(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["run", "--kubeconfig", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_settings_file_flags_override_and_typos_fail(tmp_path: Path) -> None:
    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text(
        "tick_s: 3\nlease_duration_s: 20\nrenew_deadline_s: 12\n"
        "actuator: {max_scale_actions_per_tick: 7, mig_relayout: false}\n"
        "metrics: {preset: triton, matchers: 'job=\"triton\"'}\n"
        "policy_knobs: {scale_down_stabilization_s: 300}\n"
    )
    s = build_settings(_args("--config", str(cfg), "--dry-run", "--allow-mig-relayout", "--tick", "2",
                             "--listen", "127.0.0.1:9100"))
    assert s.tick_s == 2.0 and s.lease_duration_s == 20 and s.policy_knobs == {"scale_down_stabilization_s": 300}
    assert s.actuator.dry_run and s.actuator.mig_relayout and s.actuator.max_scale_actions_per_tick == 7
    assert s.metric_names.requests.startswith("nv_inference") and s.metric_names.matchers == 'job="triton"'
    assert (s.http_host, s.http_port) == ("127.0.0.1", 9100)
    cfg.write_text("tick_seconds: 3\n")
    with pytest.raises(ValueError, match=r"unknown setting.*tick_seconds"):
        build_settings(_args("--config", str(cfg)))
    cfg.write_text("actuator: {dryrun: true}\n")
    with pytest.raises(ValueError, match=r"unknown actuator setting.*dryrun"):
        build_settings(_args("--config", str(cfg)))


def test_lending_settings_are_parsed_and_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text("lending: {enabled: true, mode: kueue, max_reclaim_s: 90}\n")
    s = build_settings(_args("--config", str(cfg)))
    assert s.lending.enabled and s.lending.mode == "kueue" and s.lending.max_reclaim_s == 90
    cfg.write_text("lending: {enable: true}\n")
    with pytest.raises(ValueError, match=r"unknown lending setting.*enable"):
        build_settings(_args("--config", str(cfg)))
    cfg.write_text("lending: {mode: volcano}\n")
    with pytest.raises(ValueError, match="pods' or 'kueue'"):
        build_settings(_args("--config", str(cfg)))


def test_teams_and_arbitration_settings_are_parsed_into_the_policy(tmp_path: Path) -> None:
    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text(
        "teams:\n"
        "  - {name: search, guaranteed_gpus: 8, borrowing_limit_gpus: 4}\n"
        "  - {name: research, guaranteed_gpus: 2.5}\n"
        "arbitration: {mode: priority, min_runtime_s: 120, max_preemptions_per_tick: 3}\n"
    )
    s = build_settings(_args("--config", str(cfg)))
    a = s.arbitration
    assert a.mode == "priority" and a.min_runtime_s == 120 and a.max_preemptions_per_tick == 3 and a.preemption
    assert a.teams == (TeamQuota("search", 8, 4), TeamQuota("research", 2.5, None))
    assert a.quota("search").limit_gpus == 12 and a.quota("research").limit_gpus == math.inf
    assert a.quota("nobody") == TeamQuota("nobody")  # not listed: no guarantee, no limit
    # the controller hands the policy to the decision core, and the quotas to the exporter
    ctl = Controller(object(), s)
    assert ctl.core.arbitration == a
    assert ctl.exporter.quotas == {"search": a.teams[0], "research": a.teams[1]}
    # neither key: the defaults
    cfg.write_text("tick_s: 3\n")
    assert build_settings(_args("--config", str(cfg))).arbitration == ArbitrationPolicy()


@pytest.mark.parametrize(("text", "message"), [
    ("arbitration: {mode: fifo}\n", "arbitration mode must be one of slo, priority, partition, got 'fifo'"),
    ("arbitration: {preempt: false}\n", "arbitration: unknown key(s) preempt"),
    ("arbitration: {min_runtime_s: -5}\n", "arbitration: min_runtime_s must be a number >= 0, got -5"),
    ("arbitration: {max_preemptions_per_tick: 2.5}\n", "arbitration: max_preemptions_per_tick must be an integer"),
    ("arbitration: {preemption: maybe}\n", "arbitration: preemption must be true or false"),
    ("arbitration: [slo]\n", "arbitration: expected a mapping of settings"),
    ("teams: {search: 8}\n", "teams must be a list of {name, guaranteed_gpus, borrowing_limit_gpus}"),
    ("teams: [search]\n", "teams[0] must be a mapping, got 'search'"),
    ("teams: [{name: a, guaranteed: 2}]\n", "teams[0]: unknown key(s) guaranteed"),
    ("teams: [{guaranteed_gpus: 2}]\n", "teams[0]: team name must be a non-empty string"),
    ("teams: [{name: a, guaranteed_gpus: -1}]\n", "teams[0]: team a: guaranteed_gpus must be a number >= 0"),
    ("teams: [{name: a, borrowing_limit_gpus: lots}]\n", "teams[0]: team a: borrowing_limit_gpus must be a number"),
    ("teams: [{name: a}, {name: a}]\n", "teams listed twice: a"),
])
def test_teams_and_arbitration_errors_name_the_key_and_exit_2(tmp_path: Path, capsys, text: str,
                                                               message: str) -> None:
    cfg = tmp_path / "slotwise.yaml"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        build_settings(_args("--config", str(cfg)))
    # the command line: one line on stderr, exit 2, before any cluster is looked for
    assert main(["run", "--config", str(cfg), "--kubeconfig", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slotwise: ") and message in err and err.count("\n") == 1
