"""PNG of a simulation: load, replicas and latency against the SLO over time, for the busiest models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoscaler.sim.run import SimResult


def plot_results(results: Sequence[SimResult], path: str, top: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = results[0]
    busiest = np.argsort(-base.minute_arrivals.sum(axis=1))[: max(1, min(top, len(base.models)))]
    fig, axes = plt.subplots(len(busiest), 2, figsize=(14, 3.6 * len(busiest)), squeeze=False)
    minutes = np.arange(base.minute_arrivals.shape[1])
    hours = minutes / 60.0
    for row, i in enumerate(busiest):
        name = base.models[i]
        ax_load, ax_lat = axes[row]
        ax_load.fill_between(hours, base.minute_arrivals[i] / 60.0, color="0.85", label="load (req/s)")
        ax_load.set_ylabel("req/s")
        ax_rep = ax_load.twinx()
        for r in results:
            ax_rep.step(hours, r.minute_replicas[i], where="post", label=f"{r.policy} replicas", lw=1.2)
        ax_rep.set_ylabel("ready replicas")
        ax_load.set_title(f"{name}: load and replicas")
        handles = ax_load.get_legend_handles_labels()[0] + ax_rep.get_legend_handles_labels()[0]
        labels = ax_load.get_legend_handles_labels()[1] + ax_rep.get_legend_handles_labels()[1]
        ax_load.legend(handles, labels, loc="upper left", fontsize=7)
        for r in results:
            ax_lat.plot(hours, r.minute_latency[i], lw=1.0, label=r.policy)
        ax_lat.axhline(base.slo_latency_s[i], color="red", ls="--", lw=1.0, label="SLO")
        ax_lat.set_yscale("log")
        ax_lat.set_title(f"{name}: p{base.slo_percentile[i]:g} latency (s) vs SLO")
        ax_lat.legend(loc="upper left", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
