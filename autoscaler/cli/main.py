"""``slotwise`` command line: one subcommand module per verb beside it in ``autoscaler/cli``."""

from __future__ import annotations

import argparse
import os
import sys

from forecasting.traces.model import TraceFormatError


def build_parser() -> argparse.ArgumentParser:
    from autoscaler.cli import backtest, frontier, migbench, packbench, report, run, simulate, trace

    parser = argparse.ArgumentParser(prog="slotwise", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    trace.register(sub)
    simulate.register(sub)
    packbench.register(sub)
    backtest.register(sub)
    migbench.register(sub)
    frontier.register(sub)
    run.register(sub)
    report.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`slotwise trace info … | head`): not an error worth a message.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except TraceFormatError as e:
        print(f"slotwise: bad trace: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"slotwise: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
