"""PNG of a simulation: GPUs in use per policy over time, then, for the busiest models, load and replicas, and
latency against the SLO.

Time runs from the simulation's start, in minutes, hours or days (whichever reads best). The workload's history
(before 0: the forecaster's warm start, not simulated) and the burn-in (simulated, not scored) are shaded and named
in the legend; the per-minute series (``SimResult.minute_*``) cover the scored period only, so they start at the
end of the burn-in. One legend for the whole figure sits above the panels (each policy has one colour in every
panel), so it never covers a line; the replica axes have whole-number ticks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autoscaler.sim.run import SimResult
from autoscaler.sim.workload import SimWorkload

HISTORY_COLOR = "#dbe7f4"
BURN_IN_COLOR = "#f4e3c8"
GPU_PANEL_TITLE = "GPUs in use (GPU-equivalents held by replicas, mean per minute)"


def _gpu_h(h: float) -> str:  # as the headline prints them (autoscaler/report/headline.py)
    return f"{h:,.1f}" if h >= 100 else f"{h:.2f}"


def gpus_in_use(result: SimResult) -> np.ndarray:
    """Mean GPU-equivalents held per scored minute, all models together (the last minute may be shorter)."""
    held = result.minute_gpu_s
    n = result.minute_arrivals.shape[1]
    if held is None:
        return np.full(n, np.nan)
    seconds = np.full(n, 60.0)
    if n and result.scored_s > 0:
        seconds[-1] = min(60.0, max(result.scored_s - 60.0 * (n - 1), 1e-9))
    return np.asarray(held, dtype=np.float64).sum(axis=0) / seconds


def time_unit(span_s: float) -> tuple[str, float]:
    """The x axis' unit for a figure spanning ``span_s`` seconds, and its length in seconds."""
    if span_s <= 3 * 3600.0:
        return "minutes", 60.0
    if span_s <= 3 * 86400.0:
        return "hours", 3600.0
    return "days", 86400.0


def duration(s: float) -> str:
    if s < 3 * 3600.0:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h" if s < 3 * 86400.0 else f"{s / 86400:.1f} days"


def _minutes_s(result: SimResult, n: int) -> np.ndarray:
    """Start of each scored minute, in seconds since the simulation start."""
    return result.burn_in_s + 60.0 * np.arange(n)


def _load(workload: SimWorkload | None, base: SimResult, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, req/s) of model ``i``: the history and the whole simulated period from the workload if given,
    else the scored minutes of the run."""
    if workload is None:
        return _minutes_s(base, base.minute_arrivals.shape[1]), base.minute_arrivals[i] / 60.0
    name = base.models[i]
    sim = workload.arrivals_per_tick(60.0)[list(workload.models).index(name)] / 60.0
    x, y = [np.arange(sim.size) * 60.0], [sim]
    h = workload.history
    if h is not None and name in h.models:
        rates = np.nan_to_num(h.rates[list(h.models).index(name)])
        x.insert(0, np.arange(rates.size) * h.step_s - h.duration_s)
        y.insert(0, rates)
    return np.concatenate(x), np.concatenate(y)


def _plain_log_axis(ax: Any) -> None:
    """Seconds on a log axis as plain numbers (0.5, 1, 2, 10), not 2x10^0; 2 and 5 between the decades when the
    axis spans less than about one and a half, where the decades alone leave one tick or none."""
    from matplotlib.ticker import FuncFormatter

    def major(v: float, _: int) -> str:
        return f"{v:g}"

    def minor(v: float, _: int) -> str:
        lo, hi = ax.get_ylim()
        lead = round(v / 10 ** np.floor(np.log10(v)), 6) if v > 0 else 0.0
        return f"{v:g}" if lo > 0 and hi / lo < 10**1.5 and lead in (2.0, 5.0) else ""

    ax.yaxis.set_major_formatter(FuncFormatter(major))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def _shade(ax: Any, history: float, burn_in: float) -> None:
    if history > 0:
        ax.axvspan(-history, 0.0, color=HISTORY_COLOR, zorder=0, lw=0)
    if burn_in > 0:
        ax.axvspan(0.0, burn_in, color=BURN_IN_COLOR, zorder=0, lw=0)


def plot_results(results: Sequence[SimResult], path: str, top: int = 3, workload: SimWorkload | None = None) -> None:
    """Write the PNG (:func:`figure`)."""
    import matplotlib.pyplot as plt

    fig = figure(results, top, workload)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(results: Sequence[SimResult], top: int = 3, workload: SimWorkload | None = None) -> Any:
    """The figure: the GPU panel, then load and replicas, and latency, for the ``top`` busiest models.
    ``workload``: the run's workload, for the load before and during the burn-in and the history's length (without
    it the load is drawn over the scored minutes only and no history is marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    base = results[0]
    busiest = np.argsort(-base.minute_arrivals.sum(axis=1))[: max(1, min(top, len(base.models)))]
    history = workload.history if workload is not None else None
    history_s = history.duration_s if history is not None else 0.0
    end_s = workload.duration_s if workload is not None else max(r.burn_in_s + r.scored_s for r in results)
    unit, per = time_unit(history_s + end_s)
    history_x, burn_in_x = history_s / per, base.burn_in_s / per
    colors = {r.policy: f"C{k % 10}" for k, r in enumerate(results)}
    fig = plt.figure(figsize=(14, 3.4 * (1 + len(busiest))))
    grid = fig.add_gridspec(1 + len(busiest), 2)
    ax_gpu = fig.add_subplot(grid[0, :])
    _shade(ax_gpu, history_x, burn_in_x)
    for r in results:
        g = gpus_in_use(r)
        ax_gpu.step(_minutes_s(r, g.size) / per, g, where="post", color=colors[r.policy], lw=1.3)
    ax_gpu.set_ylabel("GPUs")
    ax_gpu.set_ylim(bottom=0)
    ax_gpu.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_gpu.set_title(GPU_PANEL_TITLE)
    ax_gpu.set_xlim(-history_x, end_s / per)  # shared by every panel
    if history_x > 0:
        ax_gpu.text(-history_x / 2, 0.5, "history\n(warm start,\nnot simulated)", ha="center", va="center",
                    transform=ax_gpu.get_xaxis_transform(), fontsize=8, color="0.35")
    rows = []
    for row, i in enumerate(busiest, start=1):
        name = base.models[i]
        ax_load = fig.add_subplot(grid[row, 0], sharex=ax_gpu)
        ax_lat = fig.add_subplot(grid[row, 1], sharex=ax_gpu)
        rows.append((ax_load, ax_lat))
        _shade(ax_load, history_x, burn_in_x)
        _shade(ax_lat, history_x, burn_in_x)
        lx, ly = _load(workload, base, i)
        ax_load.fill_between(lx / per, ly, step="post", color="0.82", lw=0)
        ax_load.set_ylabel("load (req/s)")
        ax_load.set_ylim(bottom=0)
        ax_rep = ax_load.twinx()
        for r in results:
            ax_rep.step(_minutes_s(r, r.minute_replicas.shape[1]) / per, r.minute_replicas[i], where="post",
                        color=colors[r.policy], lw=1.2)
        ax_rep.set_ylabel("ready replicas")
        ax_rep.set_ylim(bottom=0)
        ax_rep.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax_load.set_title(f"{name}: load (grey) and ready replicas")
        for r in results:
            ax_lat.plot(_minutes_s(r, r.minute_latency.shape[1]) / per, r.minute_latency[i], color=colors[r.policy],
                        lw=1.0)
        ax_lat.axhline(base.slo_latency_s[i], color="black", ls="--", lw=1.0)
        ax_lat.set_yscale("log")
        _plain_log_axis(ax_lat)
        ax_lat.set_title(f"{name}: p{base.slo_percentile[i]:g} latency (s), worst tick of each minute, vs SLO")
    for ax in (rows[-1] if rows else (ax_gpu,)):
        ax.set_xlabel(f"{unit} since the simulation start")
    handles: list[Any] = [plt.Line2D([], [], color=colors[r.policy], lw=2,
                                     label=f"{r.policy} ({_gpu_h(r.gpu_hours)} GPU-h)") for r in results]
    handles += [Patch(color="0.82", label="load (req/s)"), plt.Line2D([], [], color="black", ls="--", label="SLO")]
    if history_s > 0:
        handles.append(Patch(color=HISTORY_COLOR, label=f"history: forecaster warm start ({duration(history_s)})"))
    if base.burn_in_s > 0:
        handles.append(Patch(color=BURN_IN_COLOR, label=f"burn-in: simulated, not scored ({duration(base.burn_in_s)})"))
    legend = fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(handles), 5),
                        fontsize=8, frameon=False)
    # Room for the legend above the panels: measure it, then lay the axes out below it.
    fig.canvas.draw()
    legend_h = legend.get_window_extent(fig.canvas.get_renderer()).height / fig.bbox.height
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - legend_h - 0.005))
    return fig
