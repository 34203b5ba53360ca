"""Render the JSON written by `slotwise simulate --json` as a markdown table (for docs/benchmarks.md).

    .venv/bin/python bench/scorecard_md.py OUT.json [OUT2.json ...]
"""

from __future__ import annotations

import json
import sys

ROWS = (
    ("requests", "{:,.0f}"),
    ("slo_attainment", "{:.4f}"),
    ("slo_windows_met", "{:.4f}"),
    ("slo_requests_met", "{:.4f}"),
    ("violating_requests", "{:,.0f}"),
    ("gpu_hours", "{:,.2f}"),
    ("gpu_hours_vs_oracle", "{:.3f}"),
    ("lent_gpu_hours", "{:.1f}"),
    ("scale_events", "{:,}"),
    ("unplaced_replica_minutes", "{:,.1f}"),
    ("fragmentation", "{:.3f}"),
    ("sim_wall_s", "{:.1f}"),
)


def table(doc: dict) -> str:
    cards = doc["results"] if isinstance(doc["results"], list) else [doc["results"]]
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
            p95 = c["per_model"][m]["p95_latency_s"]
            cells.append("-" if p95 is None else f"{p95:.2f}")
        slo = cards[0]["per_model"][m]["slo_latency_s"]
        lines.append(f"| p95 latency s, {m} (SLO {slo:g} s) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(table(json.load(f)))
            print()
