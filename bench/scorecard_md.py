"""Render the JSON written by `slotwise simulate --json` as a markdown table (for docs/benchmarks.md).

    .venv/bin/python bench/scorecard_md.py OUT.json [OUT2.json ...]
"""

from __future__ import annotations

import json
import sys

ROWS = (  # the scorecard's fields (autoscaler/sim/scorecard.py), the headline first
    ("slo_attainment", "{:.4f}"),
    ("violating_requests", "{:,}"),
    ("requests", "{:,}"),
    ("slo_minutes_met", "{:.4f}"),
    ("requests_within_latency", "{:.4f}"),
    ("gpu_hours", "{:,.2f}"),
    ("gpu_hours_vs_lower_bound", "{:.3f}"),
    ("gpu_hours_vs_oracle", "{:.3f}"),
    ("cost_usd", "{:,.2f}"),
    ("idle_cost_usd", "{:,.2f}"),
    ("lent_gpu_hours", "{:.1f}"),
    ("scale_events", "{:,}"),
    ("unplaced_replica_minutes", "{:,.1f}"),
    ("fragmentation", "{:.3f}"),
    ("sim_wall_s", "{:.1f}"),
)


def table(doc: dict) -> str:
    cards = doc["results"]
    gpus = sum(n["gpu_count"] for n in doc["cluster"])
    lines = [
        f"trace `{doc['trace']}`, mode `{doc['mode']}`, tick {doc['tick_s']:g} s, {gpus} GPUs",
        "",
        "| metric | " + " | ".join(c["policy"] for c in cards) + " |",
        "|---|" + "---:|" * len(cards),
    ]
    for key, fmt in ROWS:
        cells = ["-" if c.get(key) is None else fmt.format(c[key]) for c in cards]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    models = sorted(cards[0]["per_model"], key=lambda m: -cards[0]["per_model"][m]["requests"])[:3]
    for m in models:
        cells = []
        for c in cards:
            lat = c["per_model"][m]["latency_at_slo_percentile_s"]
            cells.append("-" if lat is None else f"{lat:.2f}")
        pm = cards[0]["per_model"][m]
        lines.append(f"| latency at p{pm['slo_percentile']:g} s, {m} (SLO {pm['slo_latency_s']:g} s) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(table(json.load(f)))
            print()
