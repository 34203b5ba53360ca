"""``slotwise mig-bench``: MIG packers (first-fit, cost-aware) against MILP / LP lower bounds.

    slotwise mig-bench [--scenarios h100-8,a100-16,...|small|large|all] [--seeds 1-10]
                       [--fill 0.5] [--order model|decreasing] [--exact-budget 5] [--json OUT]

Per scenario and seed: a cluster of MIG GPUs and a replica demand drawn from realistic model sizes
(``autoscaler/benchmarks/mig/bench.py``); each packer places the replicas and the GPUs it used are compared with
the exact MILP optimum (clusters of <= 16 GPUs) or the LP-relaxation bound (larger ones), from
``autoscaler/benchmarks/mig/bounds.py``. Two bounds: "LB" is plain bin-packing; "LB+AA" adds the cost-aware
packer's anti-affinity rule. Packers that keep anti-affinity (cost-aware, cost-aware-gpus) are held
to LB+AA, the others (first-fit, ``-noaa``) to LB. ``shipped`` is the packer as the decision core builds it
(``prefer_open_nodes`` on), one replica at a time; ``exact`` is that packer with the batch placed
by the per-device MILP (``sharing/mig_exact.py``; beyond 16 GPUs the aggregated layout-count MILP)
within its work limit (a HiGHS node limit per solve, so the same instance gets the same placement on any machine)
and the wall-clock safety cut ``--exact-budget``, the heuristic's placement where no solution came or the MILP's is
not better; it counts as met only where the safety cut did not fire (``in budget``). ``plans`` is a digest of every
instance's exact placement: two runs that print the same one placed the same replicas on the same slots.
``controller`` is what the controller's tick does with the same demand (one ask per model through the decision
core's arbitration, with the exact budget it ships, ``CoreConfig.exact_budget_s``; it places exactly only on <= 16
MIG GPUs or on an empty cluster). A re-layout
scenario (demand changes) reports moves, the exact re-layout beside the heuristic one. Results in docs/sharing.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from autoscaler.benchmarks.mig.bench import ORDERS, PACKERS, SCENARIOS, run_bench, summarise
from sharing.mig_exact import DEFAULT_BUDGET_S


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mig-bench", help="MIG packers against exact MILP / LP lower bounds")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenarios", default="small", help=f"comma list of {', '.join(SCENARIOS)}; or small, large, all")
    p.add_argument("--seeds", default="1-10", help="seeds, e.g. 1-10 or 1,2,3 (default 1-10)")
    p.add_argument("--fill", type=float, default=0.5, help="demand as a share of the cluster (default 0.5)")
    p.add_argument(
        "--order",
        default="model",
        choices=ORDERS,
        help="replica arrival: model by model (default) or largest first (first-fit-decreasing)",
    )
    p.add_argument(
        "--exact-budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"the exact (MILP) placement's wall-clock safety cut per instance, seconds (default {DEFAULT_BUDGET_S:g})",
    )
    p.add_argument("--json", default=None, help="write rows and summary here")


def _scenarios(text: str) -> list[str]:
    t = text.strip()
    if t == "all":
        return list(SCENARIOS)
    if t in ("small", "large"):
        return [k for k, (_, small) in SCENARIOS.items() if small == (t == "small")]
    names = [x.strip() for x in t.split(",") if x.strip()]
    bad = [n for n in names if n not in SCENARIOS]
    if bad or not names:
        raise ValueError(f"unknown scenario {', '.join(bad) or text!r} (known: {', '.join(SCENARIOS)})")
    return names


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    if not out:
        raise ValueError(f"no seeds in {text!r}")
    return out


def run(args: argparse.Namespace) -> int:
    if not 0 < args.fill <= 1:
        raise ValueError(f"--fill must be in (0, 1], got {args.fill}")
    if not args.exact_budget > 0:
        raise ValueError(f"--exact-budget must be positive, got {args.exact_budget}")
    rows = run_bench(_scenarios(args.scenarios), _seeds(args.seeds), args.fill, args.order, args.exact_budget)
    summary = summarise(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)
    _print(summary, rows)
    return 0


def _print(summary: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    out = sys.stdout
    out.write(
        f"{'scenario':<10} {'packer':<20} {'n':>3} {'bound':<5} {'reps':>6} {'LB':>6} {'LB+AA':>6} {'gpus':>7} "
        f"{'/LB':>6} {'held':>5} {'/held':>6} {'max':>6} {'met':>7} {'$/h':>8} {'LB $/h':>8} {'unpl':>5} "
        f"{'AA':>4} {'mv':>5} {'ms':>6}\n"
    )
    for s in summary:
        out.write(
            f"{s['scenario']:<10} {s['packer']:<20} {s['instances']:>3} {s['bound_method']:<5} "
            f"{s['replicas_mean']:>6.1f} {s['bound_gpus_mean']:>6.1f} {s['bound_aa_gpus_mean']:>6.1f} "
            f"{s['gpus_mean']:>7.1f} {s['ratio_mean']:>6.3f} {s['held_to']:>5} {s['ratio_target_mean']:>6.3f} "
            f"{s['ratio_target_max']:>6.3f} {s['met']:>3}/{s['instances']:<3} "
            f"{s['cost_mean']:>8.2f} {s['bound_cost_mean']:>8.2f} {s['unplaced']:>5} {s['aa_violations']:>4} "
            f"{s['moves_mean']:>5.1f} "
            f"{1000 * s['seconds_mean']:>6.1f}\n"
        )
    out.write("\nexact placement: instances where the MILP's placement was kept, proved optimal, within budget\n")
    out.write(f"{'scenario':<10} {'n':>3} {'milp used':>10} {'optimal':>8} {'in budget':>10} {'budget s':>9} "
              f"{'max s':>6} {'met':>7} {'shipped met':>12} {'plans':>17} {'controller plans':>17}\n")
    by = {(s["scenario"], s["packer"]): s for s in summary}
    for s in summary:
        if s["packer"] != "exact":
            continue
        ca = by[(s["scenario"], "shipped")]
        out.write(
            f"{s['scenario']:<10} {s['instances']:>3} {s['milp_used']:>10} {s['milp_optimal']:>8} "
            f"{s['within_budget']:>10} {s['budget_s']:>9g} {s['milp_seconds_max']:>6.2f} "
            f"{s['met']:>3}/{s['instances']:<3} {ca['met']:>8}/{ca['instances']:<3} {s['plans']:>17} "
            f"{by[(s['scenario'], 'controller')]['plans'] if (s['scenario'], 'controller') in by else '-':>17}\n"
        )
    out.write("\nre-layout (cost-aware placement, demand changed; exact batch placement; means over seeds)\n")
    out.write(
        f"{'scenario':<10} {'kept':>6} {'placed':>7} {'removed':>8} {'moves':>6} {'mig+':>5} {'mig-':>5} "
        f"{'unpl':>5} {'gpus before':>12} {'after':>6} {'heur. after':>12} {'LB after':>9}\n"
    )
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r["relayout"] for r in rows if r["scenario"] == sc]

        def m(k: str, rs: list[dict[str, Any]] = rs) -> float:
            return sum(r[k] for r in rs) / len(rs)

        out.write(
            f"{sc:<10} {m('kept'):>6.1f} {m('placed'):>7.1f} {m('removed'):>8.1f} {m('moves'):>6.2f} "
            f"{m('mig_created'):>5.1f} {m('mig_destroyed'):>5.1f} {m('unplaced'):>5.1f} {m('gpus_before'):>12.1f} "
            f"{m('gpus_after'):>6.1f} {sum(r['heuristic']['gpus_after'] for r in rs) / len(rs):>12.1f} "
            f"{m('bound_after'):>9.1f}\n"
        )


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (until the top-level CLI registers the verb)."""
    p = argparse.ArgumentParser(
        prog="slotwise mig-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    return run(p.parse_args(argv))


__all__ = ["PACKERS", "main", "register", "run"]

if __name__ == "__main__":
    sys.exit(main())
