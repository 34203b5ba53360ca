"""What learning the decode law buys when the annotations are wrong: slotwise on the bundled Azure LLM 2023 slice
with a TTFT and an ITL SLO (``bench/models_ttft_itl.yaml``), the engines serving the true law and the controller
told a wrong one, with and without the engines' ITL readings (``SimConfig.itl_metric``; without them the declared
law is all it has, as before issue 28's decode learner).

Declarations (each model's ``decode-ms-per-token`` / ``decode-batch-slowdown``, the truth being 20 ms / 0.05 with a
25 ms ITL SLO, which caps a replica's decode batch at 6 of its 8 slots):

- ``true``: told the truth;
- ``fast-decode``: 16 ms (20 % fast: a full batch seems to meet 25 ms, the cap disappears);
- ``flat-batch``: slowdown 0.02 (the cap disappears too);
- ``slow-decode``: 24 ms (20 % slow: the cap falls to one request per replica).

Prints per declaration and reading GPU-hours, violating requests and the headline attainment, side by side in one
run; ``--mode des`` runs the request-level engine (per-request batches, an ITL histogram the law does not write).

    .venv/bin/python bench/decode_learning.py [--mode fluid|des] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from autoscaler.api.spec import ModelSpec
from autoscaler.policies import make_policy
from autoscaler.sim.defaults import model_specs
from autoscaler.sim.harness import DEFAULT_TRACE, default_cluster
from autoscaler.sim.run import SimConfig, simulate
from autoscaler.sim.scorecard import scorecard
from autoscaler.sim.workload import Specs, build_workload
from forecasting.traces import resolve_trace

MODELS = Path(__file__).resolve().parent / "models_ttft_itl.yaml"
DECLARATIONS: dict[str, dict[str, float]] = {
    "true": {},
    "fast-decode": {"decode_ms_per_token": 16.0},
    "flat-batch": {"decode_batch_slowdown": 0.02},
    "slow-decode": {"decode_ms_per_token": 24.0},
}


def _told(truth: Specs, change: dict[str, float]) -> Specs:
    return {m: s.with_(**change) if isinstance(s, ModelSpec) else s for m, s in truth.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("fluid", "des"), default="fluid")
    p.add_argument("--history-hours", type=float, default=0.25)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    trace = resolve_trace(DEFAULT_TRACE, None)
    truth = model_specs(trace, str(MODELS))
    rows = []
    print(f"slotwise, {DEFAULT_TRACE} + {MODELS.name}, {args.mode}: the engines serve 20 ms / 0.05; told:")
    print(f"{'declared':<12} {'ITL read':>8} {'GPU-h':>8} {'violating':>10} {'SLO att':>8} {'wall s':>7}")
    for name, change in DECLARATIONS.items():
        w = build_workload(trace, truth, history_s=args.history_hours * 3600.0,
                           declared=_told(truth, change) if change else None)
        nodes = default_cluster(w, 10.0)
        for reads in (False, True):
            t0 = time.perf_counter()
            card = scorecard(simulate(w, nodes, make_policy("slotwise"), SimConfig(mode=args.mode, itl_metric=reads)))
            wall = time.perf_counter() - t0
            row = {"declared": name, "itl_read": reads, "gpu_hours": card["gpu_hours"],
                   "violating_requests": card["violating_requests"], "slo_attainment": card["slo_attainment"]}
            rows.append(row)
            print(f"{name:<12} {'yes' if reads else 'no':>8} {row['gpu_hours']:>8.2f} "
                  f"{row['violating_requests']:>10,.0f} {row['slo_attainment']:>8.4f} {wall:>7.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
