"""``slotwise backtest``: score forecasters on a trace with the reference rolling-origin protocol.

    slotwise backtest --series FILE|FOLDER|BUNDLED-NAME --json OUT [--forecasters LIST]
                      [--from FORMAT] [--step S] [--limit N]

The baselines naive, snaive and ets are in every run (ets needs the optional statsforecast; without
it the run says so and continues). Rate series become per-step counts (rate x step); request logs are
binned at ``--step`` seconds first. ``slotwise`` is the controller's forecaster exactly as it ships (the batch
``FleetForecaster.new_batch`` builds for the set's step and horizon): the backtest has no settings of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoscaler.benchmarks.backtest.protocol import DEFAULT_FORECASTERS, RUNNERS, backtest, load_counts
from forecasting.traces import FORMATS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backtest", help="score forecasters on a trace (rolling origins, pooled wQL / coverage)")
    p.add_argument("--series", required=True, metavar="FILE", help="trace file or folder, or a bundled trace name")
    p.add_argument("--json", required=True, metavar="OUT", help="write the results here (JSON)")
    p.add_argument(
        "--forecasters",
        default=",".join(DEFAULT_FORECASTERS),
        help=f"comma-separated, from {','.join(RUNNERS)} (naive, snaive, ets always run); "
        f"default {','.join(DEFAULT_FORECASTERS)}",
    )
    p.add_argument("--from", dest="fmt", choices=list(FORMATS), default=None, help="format (default: detected)")
    p.add_argument("--step", type=float, default=60.0, help="bin width in seconds for request logs (default 60)")
    p.add_argument("--limit", type=int, default=None, help="score only the first N series (quick looks)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_backtest)


def cmd_backtest(args: argparse.Namespace) -> int:
    names = tuple(x.strip() for x in args.forecasters.split(",") if x.strip())
    unknown = [x for x in names if x not in RUNNERS]
    if unknown:
        print(
            f"slotwise backtest: unknown forecaster(s) {', '.join(unknown)} (known: {', '.join(RUNNERS)})",
            file=sys.stderr,
        )
        return 2
    y, step_s, tod = load_counts(args.series, args.fmt, args.step)
    if args.limit is not None:
        y = y[: max(1, args.limit)]

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    result = backtest(y, step_s, names, start_tod_s=tod, log=log)
    result["source"] = str(args.series)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(_table(result))
    return 0


def _table(result: dict) -> str:
    lines = [
        f"{result['series']} series x {result['origins_per_series']} origins, step {result['step_s']:g} s, "
        f"h {result['h']}, season {result['season']}",
        f"{'forecaster':<10} {'wQL0.5':>8} {'wQL0.9':>8} {'wQL0.99':>8} {'cov0.9':>7} {'cov0.99':>7} {'ms/fc':>8}",
    ]
    for name, r in result["forecasters"].items():
        if "skipped" in r:
            lines.append(f"{name:<10} skipped: {r['skipped']}")
            continue
        w, c = r["wql"], r["coverage"]
        lines.append(
            f"{name:<10} {w['0.5']:8.4f} {w['0.9']:8.4f} {w['0.99']:8.4f} {c['0.9']:7.3f} {c['0.99']:7.3f} "
            f"{r['ms_per_forecast']:8.3f}"
        )
    return "\n".join(lines)
