"""``slotwise pack-bench``: the FGD paper's protocol (Weng et al., ATC'23) on the Alibaba GPU trace.

    slotwise pack-bench --nodes CSV --pods CSV[,CSV...] --policy NAME[,NAME...] --seeds 42-51
                        [--replay DIR] [--expected CSV] [--jobs N] --json OUT

Per trace, seed and policy: pods arrive one at a time (tuned to 130% of GPU capacity), never
depart, and are placed or dropped; the result is unallocated GPUs at 100% and 130% arrival, mean
over seeds. With ``--replay`` the original simulator's arrival and tie-break orders are used where
the folder has them; ``--expected`` (``analysis_allo_discrete.csv``) puts the published means beside
ours. Protocol details: ``autoscaler/benchmarks/fgd`` and docs/sharing.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autoscaler.benchmarks.fgd.bench import POLICY_NAMES, load_experiment, parse_seeds, run_one, summarise


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pack-bench", help="FGD-protocol GPU packing benchmark on the Alibaba GPU trace")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", required=True, help="GPU node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", required=True, help="pod list CSV, or a comma list of them (one trace variant each)")
    p.add_argument("--policy", default="fgd,slotwise", help=f"comma list of {', '.join(POLICY_NAMES)}, or all")
    p.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 42,43 (default 42-51)")
    p.add_argument("--replay", default=None, help="folder with arrival_order_*/node_prefix_* replay files")
    p.add_argument("--expected", default=None, help="published analysis_allo_discrete.csv to compare with")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--json", required=True, help="write runs and summary here")


def _policies(text: str) -> list[str]:
    names = list(POLICY_NAMES) if text.strip() == "all" else [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        raise ValueError(f"unknown policy {', '.join(bad) or text!r} (known: {', '.join(POLICY_NAMES)})")
    return names


def _trace_runs(task: tuple[str, str, list[int], str | None, list[str]]) -> list[dict[str, Any]]:
    nodes, pods, seeds, replay, policies = task
    exp = load_experiment(nodes, pods, seeds, replay)
    return [run_one(exp, pol, s) for pol in policies for s in seeds]


def _split(task: tuple[str, str, list[int], str | None, list[str]]) -> list[tuple]:
    nodes, pods, seeds, replay, policies = task
    # One task per (trace, policy): the trace and its replay load once per task, not per seed.
    return [(nodes, pods, seeds, replay, [p]) for p in policies]


def run(args: argparse.Namespace) -> int:
    policies = _policies(args.policy)
    seeds = parse_seeds(args.seeds)
    pods_list = [x.strip() for x in args.pods.split(",") if x.strip()]
    tasks = [(args.nodes, pods, seeds, args.replay, policies) for pods in pods_list]
    runs: list[dict[str, Any]] = []
    if args.jobs > 1:
        small = [t for task in tasks for t in _split(task)]
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for rs in pool.map(_trace_runs, small):
                runs.extend(rs)
    else:
        for task in tasks:
            runs.extend(_trace_runs(task))
    summary = summarise(runs, args.expected)
    with open(args.json, "w") as f:
        json.dump({"policies": policies, "seeds": seeds, "summary": summary, "runs": runs}, f, indent=1)
    _print(summary, runs)
    return 0


def _print(summary: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    replayed = {r["trace"]: r["replayed"] for r in runs}
    out = sys.stdout
    out.write(f"{'trace':<28} {'policy':<11} {'unalloc@100':>11} {'pub@100':>8} {'unalloc@130':>11} "
              f"{'pub@130':>8} {'s/run':>6}\n")
    def cell(row: dict[str, Any], key: str) -> str:
        v = row.get(key)
        return "-" if v is None else f"{v:.1f}"

    for row in summary:
        flag = "" if replayed.get(row["trace"]) else " (own arrival order)"
        out.write(f"{row['trace']:<28} {row['policy']:<11} {cell(row, 'unalloc_100'):>11} "
                  f"{cell(row, 'published_100'):>8} {cell(row, 'unalloc_130'):>11} {cell(row, 'published_130'):>8} "
                  f"{row['seconds_mean']:>6.2f}{flag}\n")


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (until the top-level CLI registers the verb)."""
    p = argparse.ArgumentParser(prog="slotwise pack-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
