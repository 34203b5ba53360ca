"""How low pooled coverage@0.9 can go on a set when every series is calibrated on its own.

The protocol counts a target as covered when y <= yhat and every forecast of a count is >= 0, so a
zero target is covered by any forecast, and so is a target at or below what the series just did
(a constant timer series forecast exactly is covered at every step). Pooled coverage is the mean of
the series' coverages (every series has the same number of targets), so with each series calibrated
at 0.9 the pooled figure is at least mean_i max(0.9, share of series i's targets that are covered by
construction). This prints that floor for the dev sets, with two notions of "covered by
construction": zero targets, and targets at or below the minimum of the series' last 30 values.
With ``--forecast`` it also runs the shipped forecaster (the batch ``slotwise backtest`` scores) and
splits its coverage by the series' zero share.

    .venv/bin/python bench/coverage_floor.py [--forecast] [SET ...]   (SET: servegen, azure)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from autoscaler.benchmarks.backtest.protocol import load_counts, run_slotwise
from autoscaler.benchmarks.backtest.setup import protocol_setup

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SETS = {
    "servegen": DATA / "servegen" / "m-small",
    "azure": DATA / "azure_functions_2019_500fn_8h" / "invocations.csv",
}
LEVEL = 0.9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sets", nargs="*", metavar="SET", help=f"from {', '.join(SETS)} (default: all)")
    ap.add_argument("--forecast", action="store_true", help="also run the shipped forecaster (~1 min per set)")
    args = ap.parse_args()
    unknown = [x for x in args.sets if x not in SETS]
    if unknown:
        ap.error(f"unknown set(s) {', '.join(unknown)}")
    for name in args.sets or list(SETS):
        y, step_s, tod = load_counts(SETS[name])
        setup = protocol_setup(y.shape[1], step_s, tod)
        targets = np.stack([y[:, t : t + setup.h] for t in setup.origins])  # (O, M, h)
        zero = (targets == 0).mean(axis=(0, 2))
        recent_min = np.stack([y[:, t - 30 : t].min(axis=1) for t in setup.origins])[:, :, None]
        low = (targets <= recent_min).mean(axis=(0, 2))
        print(
            f"{name}: {y.shape[0]} series, zero targets {(targets == 0).mean():.3f}; "
            f"series with >= 90% zero targets {(zero >= LEVEL).sum()}; "
            f"pooled cov@0.9 floor: every series at max(0.9, zero share) {np.maximum(LEVEL, zero).mean():.4f}, "
            f"at max(0.9, share <= min of last 30) {np.maximum(LEVEL, low).mean():.4f}"
        )
        if args.forecast:
            pred, _ = run_slotwise(y, setup, np.array([0.5, LEVEL, 0.99]))  # (O, M, Q, h)
            cov = (targets <= pred[:, :, 1]).mean(axis=(0, 2))
            busy = zero < LEVEL
            print(
                f"  shipped forecaster: pooled {cov.mean():.4f}; {busy.sum()} series with zero share < 0.9: "
                f"{cov[busy].mean():.3f} (their floor {np.maximum(LEVEL, zero[busy]).mean():.3f}); "
                f"the other {(~busy).sum()}: {cov[~busy].mean():.3f} (zero share {zero[~busy].mean():.3f})"
            )


if __name__ == "__main__":
    main()
