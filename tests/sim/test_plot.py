"""The simulation PNG (autoscaler/sim/plot.py): the GPU panel, whole-number replica axes, a legend that covers no
panel, and the warm-start history and burn-in marked -- on a real small simulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoscaler.api.spec import ModelSpec
from autoscaler.policies import make_policy
from autoscaler.sim.plot import (
    BURN_IN_COLOR,
    GPU_PANEL_TITLE,
    HISTORY_COLOR,
    figure,
    gpus_in_use,
    plot_results,
    time_unit,
)
from autoscaler.sim.run import SimConfig, SimResult, simulate
from autoscaler.sim.workload import SimWorkload, build_workload
from forecasting.traces.model import RateSeries
from sharing.cluster import nodes_from_spec

HISTORY_MIN = 10


def _spec(name: str) -> ModelSpec:
    return ModelSpec(name=name, slo_latency_ms=800, gpu_memory_gib=20, gpu_compute_share=0.25, service_time_ms=150,
                     cold_start_s=60, concurrency=1, slot_speeds=(("H100-80GB", 1.0),))


@pytest.fixture(scope="module")
def run() -> tuple[SimWorkload, list[SimResult]]:
    minutes = HISTORY_MIN + 30
    t = np.arange(minutes)
    rates = np.vstack([4.0 + 3.0 * np.sin(t / 5.0), 1.0 + (t % 7 == 0) * 6.0])
    trace = RateSeries(rates=rates, models=("a", "b"), step_s=60.0)
    workload = build_workload(trace, {"a": _spec("a"), "b": _spec("b")}, history_s=HISTORY_MIN * 60.0)
    nodes = nodes_from_spec("2xH100-80GB:mig")
    results = [simulate(workload, nodes, make_policy(p), SimConfig(tick_s=10.0)) for p in ("hpa", "static")]
    for p, r in zip(("hpa", "static"), results, strict=True):
        r.policy = p
    return workload, results


def _overlap(a, b) -> float:  # type: ignore[no-untyped-def]
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)


def test_gpu_panel_per_policy_adds_up_to_the_gpu_hours(run: tuple[SimWorkload, list[SimResult]]) -> None:
    workload, results = run
    fig = figure(results, workload=workload)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles.count(GPU_PANEL_TITLE) == 1
    gpu_ax = fig.axes[titles.index(GPU_PANEL_TITLE)]
    assert len(gpu_ax.get_lines()) == len(results)  # one line per policy
    for line, r in zip(gpu_ax.get_lines(), results, strict=True):
        g = gpus_in_use(r)
        np.testing.assert_allclose(line.get_ydata(), g)
        # mean GPUs per minute x the minute's length = the GPU-hours the scorecard reports
        seconds = np.full(g.size, 60.0)
        seconds[-1] = r.scored_s - 60.0 * (g.size - 1)
        assert float(np.sum(g * seconds)) / 3600.0 == pytest.approx(r.gpu_hours, rel=1e-6)
    # two panels per model besides (2 models here, each with load/replicas and latency) + the replica twins
    assert sum("load" in t for t in titles) == 2 and sum("latency" in t for t in titles) == 2


def test_replica_axes_have_whole_number_ticks(run: tuple[SimWorkload, list[SimResult]]) -> None:
    workload, results = run
    fig = figure(results, workload=workload)
    fig.canvas.draw()
    replica_axes = [ax for ax in fig.axes if ax.get_ylabel() == "ready replicas"]
    assert len(replica_axes) == 2
    for ax in replica_axes:
        lo, hi = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo - 1e-9 <= t <= hi + 1e-9]
        assert len(ticks) >= 2
        assert all(float(t).is_integer() for t in ticks), ticks
        assert all(lab.get_text().lstrip("−-").isdigit() for lab in ax.get_yticklabels() if lab.get_text())


def test_legend_covers_no_panel_and_fits_the_figure(run: tuple[SimWorkload, list[SimResult]]) -> None:
    workload, results = run
    fig = figure(results, workload=workload)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert not any(ax.get_legend() for ax in fig.axes)  # one figure legend, none inside a panel
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        assert _overlap(box, ax.get_window_extent(renderer)) == 0.0, ax.get_title()
    assert box.x0 >= fig.bbox.x0 and box.x1 <= fig.bbox.x1 and box.y0 >= fig.bbox.y0 and box.y1 <= fig.bbox.y1
    labels = [t.get_text() for t in legend.get_texts()]
    assert any(lab.startswith("hpa (") and "GPU-h" in lab for lab in labels)


def test_history_and_burn_in_are_shaded_and_named(run: tuple[SimWorkload, list[SimResult]]) -> None:
    import matplotlib.colors as mcolors

    workload, results = run
    fig = figure(results, workload=workload)
    gpu_ax = next(ax for ax in fig.axes if ax.get_title() == GPU_PANEL_TITLE)
    spans = {mcolors.to_hex(p.get_facecolor()): (p.get_x(), p.get_x() + p.get_width()) for p in gpu_ax.patches}
    unit, per = time_unit(HISTORY_MIN * 60.0 + workload.duration_s)
    assert unit == "minutes" and per == 60.0  # a 40-minute figure reads in minutes
    history, burn_in = HISTORY_MIN * 60.0 / per, results[0].burn_in_s / per
    assert burn_in > 0
    assert spans[HISTORY_COLOR] == pytest.approx((-history, 0.0))
    assert spans[BURN_IN_COLOR] == pytest.approx((0.0, burn_in))
    assert gpu_ax.get_xlim() == pytest.approx((-history, workload.duration_s / per))
    labels = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert f"history: forecaster warm start ({HISTORY_MIN} min)" in labels and "burn-in" in labels
    # the scored series start after the burn-in
    assert gpu_ax.get_lines()[0].get_xdata()[0] == pytest.approx(burn_in)
    assert any(ax.get_xlabel() == "minutes since the simulation start" for ax in fig.axes)


def test_time_unit_reads_best() -> None:
    assert time_unit(40 * 60.0) == ("minutes", 60.0)
    assert time_unit(48 * 3600.0) == ("hours", 3600.0)
    assert time_unit(14 * 86400.0) == ("days", 86400.0)


def test_without_history_nothing_is_marked_as_history(run: tuple[SimWorkload, list[SimResult]], tmp_path: Path) -> None:
    _, results = run
    fig = figure(results)  # no workload: the scored minutes only
    gpu_ax = next(ax for ax in fig.axes if ax.get_title() == GPU_PANEL_TITLE)
    import matplotlib.colors as mcolors

    assert HISTORY_COLOR not in {mcolors.to_hex(p.get_facecolor()) for p in gpu_ax.patches}
    assert not any("history" in t.get_text() for t in fig.legends[0].get_texts())
    out = tmp_path / "sim.png"
    plot_results(results, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
