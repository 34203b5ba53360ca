"""``slotwise run``: where the cluster comes from, and the settings file's errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autoscaler.cli import build_parser, main
from autoscaler.commands.run import build_settings


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
