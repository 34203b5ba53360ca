"""``slotwise`` command line: one subcommand module per verb beside it in ``autoscaler/cli``; this module is the
top-level parser (its ``--help`` for users: what slotwise is, the verbs, where to start) and ``--version`` (the
installed package's version, from its metadata)."""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from forecasting.traces.model import TraceFormatError

DISTRIBUTION = "slotwise"  # the name in pyproject.toml's [project]

# The verbs, in the order a new user meets them, each in one line (the top-level --help lists exactly these; a test
# checks every registered verb is here).
VERBS: dict[str, str] = {
    "simulate": "run the control loop on a simulated cluster driven by a trace; score it against HPA, KPA, ...",
    "run": "run the controller on a Kubernetes cluster (in a pod, or from a kubeconfig)",
    "activator": "the request-holding proxy in front of models scaled to zero (runs beside the controller)",
    "report": "cost per team and model, idle and lent GPUs, SLO attainment (from a simulation or Prometheus)",
    "trace": "inspect a trace, convert it to the canonical CSV formats, list the bundled traces",
    "pack-bench": "GPU packing benchmark on the Alibaba GPU trace (the FGD paper's protocol)",
    "mig-bench": "MIG packers against exact MILP / LP lower bounds",
    "backtest": "score forecasters on a trace (rolling origins, pooled wQL and interval coverage)",
    "frontier": "slotwise against the GPU-hours / violations curves of baselines swept over their targets",
}

DESCRIPTION = """\
SLO-driven autoscaling and GPU packing for Kubernetes inference fleets.

slotwise sizes each model's replicas for the latency SLO declared in slotwise.io/* annotations on its
workload, from a forecast of its load over its own cold-start time, and packs the replicas onto whole GPUs,
MIG slices and time-slice shares. The same control loop runs on a simulated cluster driven by real traces
(no cluster needed) and, as `slotwise run`, on Kubernetes."""


def _epilog() -> str:
    width = max(map(len, VERBS))
    verbs = "\n".join(f"  {name:<{width}}  {line}" for name, line in VERBS.items())
    return f"""\
commands:
{verbs}

where to start:
  slotwise simulate --trace azure-llm-2023 --policy all
      slotwise and the usual autoscalers on a bundled trace, side by side (no cluster needed)
  slotwise run --dry-run --prometheus http://prometheus:9090
      the controller on your cluster, logging its plan and writing nothing

`slotwise <command> --help` gives a command's options. Installing on a cluster (Helm chart, image) and the
annotations a model declares: the project's README.md, docs/kubernetes.md and docs/annotations.md."""


def package_version() -> str:
    """The installed slotwise's version (its package metadata); "unknown" when run from a tree never installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from autoscaler.cli import activator, backtest, frontier, migbench, packbench, report, run, simulate, trace

    parser = argparse.ArgumentParser(prog="slotwise", usage="slotwise [--version] [--help] <command> [options]",
                                     description=DESCRIPTION, epilog=_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"slotwise {package_version()}",
                        help="print the installed slotwise's version and exit")
    # the verbs are listed in the epilog, one line each (VERBS); argparse's own listing is hidden
    # prog: a verb's usage reads "slotwise simulate [-h] ...", not the top-level usage line before it
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>", help=argparse.SUPPRESS,
                                prog="slotwise")
    trace.register(sub)
    simulate.register(sub)
    packbench.register(sub)
    backtest.register(sub)
    migbench.register(sub)
    frontier.register(sub)
    run.register(sub)
    activator.register(sub)
    report.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help(sys.stderr)  # no verb: what slotwise is and where to start, rather than a bare error
        return 2
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
