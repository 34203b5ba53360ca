"""``slotwise run``'s issue-17 settings: the engine metric presets, the KV-cache saturation rail, the HPA/KEDA
coexistence mode -- read from the settings file and carried to the controller's decision core and actuator."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autoscaler.cli.main import build_parser
from autoscaler.cli.run import build_settings
from autoscaler.decision.scaledown import DEFAULT_KV_SATURATION
from autoscaler.live.controller import Controller
from autoscaler.live.prometheus.metrics import MetricNames, preset_names


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_every_engine_preset_is_a_choice() -> None:
    assert {"vllm", "sglang", "tgi", "triton"} <= set(preset_names())
    for name in preset_names():
        assert build_settings(_args("--metrics-preset", name)).metric_names == MetricNames.preset(name)


def test_kv_saturation_reaches_the_core_and_null_switches_it_off(tmp_path: Path) -> None:
    assert Controller(object(), build_settings(_args())).core.kv_saturation == DEFAULT_KV_SATURATION
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kv_saturation: 0.8\n")
    assert Controller(object(), build_settings(_args("--config", str(cfg)))).core.kv_saturation == 0.8
    cfg.write_text("kv_saturation: null\n")
    assert Controller(object(), build_settings(_args("--config", str(cfg)))).core.kv_saturation is None


@pytest.mark.parametrize("bad", ["1.5", "0", "'high'", "true"])
def test_a_bad_kv_saturation_names_the_key(tmp_path: Path, bad: str) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"kv_saturation: {bad}\n")
    with pytest.raises(ValueError, match="kv_saturation"):
        build_settings(_args("--config", str(cfg)))


def test_the_exact_placement_budget_is_a_setting_and_0_turns_it_off(tmp_path: Path) -> None:
    from autoscaler.decision.config import DEFAULT_EXACT_BUDGET_S

    assert Controller(object(), build_settings(_args())).core.exact_budget_s == DEFAULT_EXACT_BUDGET_S
    cfg = tmp_path / "s.yaml"
    cfg.write_text("exact_budget_s: 0\n")
    assert Controller(object(), build_settings(_args("--config", str(cfg)))).core.exact_budget_s == 0.0
    for bad in ("-1", "'fast'", "true", "100"):
        cfg.write_text(f"exact_budget_s: {bad}\n")
        with pytest.raises(ValueError, match="exact_budget_s"):
            build_settings(_args("--config", str(cfg)))


def test_the_coexistence_mode_is_an_actuator_setting(tmp_path: Path) -> None:
    assert build_settings(_args()).actuator.coexistence == "hands-off"
    cfg = tmp_path / "s.yaml"
    cfg.write_text("actuator:\n  coexistence: advise\n")
    assert build_settings(_args("--config", str(cfg))).actuator.coexistence == "advise"
