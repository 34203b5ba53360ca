"""``slotwise frontier``: slotwise against the GPU-hours-vs-violating-requests curves of HPA, KPA and ``predictive``
swept over target utilisation (issue 15's first target), on each bundled trace.

    slotwise frontier [--trace TRACE[:MODEL,...]]... [--quick | --knobs 0.3,...] [--hours H] [--history-hours H]
                      [--baselines hpa,kpa,predictive] [--jobs N] [--json OUT]

Without ``--trace``: Azure LLM 2023 (code + conversation), its conversation model alone (``azure-llm-2023:conv``),
Azure Functions 500 (``azure-functions-2019``) and ServeGen m-small. Per trace, history and simulated hours default
to ``azure-llm-2023`` 0.25 h + the rest (the demo's), ``azure-functions-2019`` 2 h + 2 h, ``servegen-m-small``
24 h + 24 h (other traces: no history, all of it); ``--hours`` / ``--history-hours`` set them for every trace.
What is compared and how: :mod:`autoscaler.benchmarks.frontier.compare`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from autoscaler.benchmarks.frontier.compare import MAX_RATIO, MAX_VS_BOUND, MIN_ATTAINMENT, MIN_SAVING, json_safe
from autoscaler.benchmarks.frontier.sweep import (
    BASELINES,
    KNOBS,
    QUICK_KNOBS,
    TARGET,
    Case,
    case_for,
    default_cases,
    evaluate,
    prepare,
    run_jobs,
    sweep_jobs,
)
from autoscaler.sim.run import SimConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("frontier", help="slotwise vs the GPU-hours/violations curves of swept baselines (issue 15)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", action="append", default=None, metavar="TRACE[:MODEL,...]",
                   help="a bundled trace name or a trace file/folder, optionally with the models to keep "
                        "(azure-llm-2023:conv); repeat for several (default: the four bundled cases)")
    p.add_argument("--from", dest="fmt", default=None, help="trace format (default: detected)")
    p.add_argument("--models", default=None, help="models file (YAML/JSON) overriding the trace's default specs")
    p.add_argument("--cluster", default=None, help="cluster spec or YAML (default: as slotwise simulate)")
    p.add_argument("--hours", type=float, default=None,
                   help="simulate only HOURS after the history (default per trace, see above)")
    p.add_argument("--history-hours", type=float, default=None,
                   help="the first HOURS warm-start the forecaster and are not simulated (default per trace)")
    knobs = p.add_mutually_exclusive_group()
    knobs.add_argument("--quick", action="store_true",
                       help=f"sweep {', '.join(f'{k:g}' for k in QUICK_KNOBS)} only (for iterating)")
    knobs.add_argument("--knobs", default=None,
                       help=f"target utilisations, comma-separated (default {','.join(f'{k:g}' for k in KNOBS)})")
    p.add_argument("--baselines", default=",".join(BASELINES), help="swept policies, comma-separated")
    p.add_argument("--mode", choices=("fluid", "des"), default="fluid", help="simulator fidelity")
    p.add_argument("--tick", type=float, default=10.0,
                   help="simulator tick in seconds (a policy with a shorter tick gets its own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="simulations in parallel processes (default 1)")
    p.add_argument("--json", default=None, help="write every point, curve and verdict here")
    p.set_defaults(func=run)


def _knobs(args: argparse.Namespace) -> list[float]:
    if args.quick:
        return list(QUICK_KNOBS)
    if args.knobs is None:
        return list(KNOBS)
    try:
        out = sorted({float(x) for x in args.knobs.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--knobs: expected comma-separated numbers, got {args.knobs!r}") from None
    if not out:
        raise ValueError("--knobs: no value")
    return out


def _cases(args: argparse.Namespace) -> list[Case]:
    for flag, v in (("--hours", args.hours), ("--history-hours", args.history_hours)):
        if v is not None and not (v > 0 or (flag == "--history-hours" and v == 0)):
            raise ValueError(f"{flag} must be {'>= 0' if flag == '--history-hours' else '> 0'}, got {v:g}")
    if not args.trace:
        cases = default_cases()
        return [case_for(c.label, args.history_hours, args.hours) for c in cases]
    return [case_for(t, args.history_hours, args.hours) for t in args.trace]


def run(args: argparse.Namespace) -> int:
    knobs = _knobs(args)
    cases = _cases(args)
    baselines = [x.strip() for x in args.baselines.split(",") if x.strip()]
    if not args.tick > 0:
        raise ValueError(f"--tick must be a positive number of seconds, got {args.tick}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    jobs = sweep_jobs(baselines, knobs)
    cfg = SimConfig(tick_s=args.tick, mode=args.mode, seed=args.seed)
    print(f"target: {TARGET}")
    print(f"sweep: {', '.join(baselines)} at {KNOB_LABEL} {', '.join(f'{k:g}' for k in knobs)}; "
          f"{len(cases)} trace(s), {len(jobs) - 1 + 3} runs each", flush=True)
    docs = []
    for case in cases:
        t0 = time.perf_counter()
        workload, nodes = prepare(case, cfg, args.models, args.cluster, args.fmt)
        head = {"label": case.label, "trace": case.trace, "models": list(workload.models),
                "history_hours": case.history_hours, "hours": workload.duration_s / 3600.0,
                "gpus": sum(n.gpu_count for n in nodes), "mode": args.mode, "tick_s": args.tick, "seed": args.seed}
        _log(f"{case.label}: {len(workload.models)} models, {head['hours']:.2f} h after {case.history_hours:g} h "
             f"of history, {head['gpus']} GPUs; {len(jobs)} jobs")
        points = run_jobs(jobs, workload, nodes, cfg, args.jobs, log=_log)
        doc = head | evaluate(points, baselines, knobs) | {"wall_s": time.perf_counter() - t0}
        print_case(doc)
        sys.stdout.flush()  # before the next case's progress lines on stderr
        docs.append(doc)
    print_summary(docs)
    if args.json:
        out = {"target": TARGET, "knob": KNOB_LABEL, "knobs": knobs, "baselines": baselines,
               "criteria": {"min_saving": MIN_SAVING, "max_ratio": MAX_RATIO, "min_attainment": MIN_ATTAINMENT,
                            "max_vs_lower_bound": MAX_VS_BOUND},
               "cases": docs}
        with open(args.json, "w") as f:
            json.dump(json_safe(out), f, indent=1)
        print(f"wrote {args.json}")
    return 0


KNOB_LABEL = "target_utilization"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _row(name: str, knob: float | None, p: dict[str, Any], note: str = "") -> str:
    return (f"  {name:<12}{_f(knob, 'g'):>7}{p['gpu_hours']:>10.2f}{_f(p.get('gpu_hours_vs_oracle'), '.3f'):>10}"
            f"{_f(p.get('gpu_hours_vs_lower_bound'), '.3f'):>9}{p['violating_requests']:>12,.0f}"
            f"{p['requests']:>13,.0f}{p['slo_attainment']:>9.4f}  {note}").rstrip()


def print_case(doc: dict[str, Any]) -> None:
    print(f"\n== {doc['label']}: {len(doc['models'])} model(s), {doc['hours']:.2f} h simulated after "
          f"{doc['history_hours']:g} h of history, {doc['gpus']} GPUs, {doc['mode']}, tick {doc['tick_s']:g} s ==")
    print(f"  {'policy':<12}{'target':>7}{'GPU-h':>10}{'x oracle':>10}{'x bound':>9}{'violating':>12}"
          f"{'requests':>13}{'SLO att':>9}  curve")
    ref = {p["policy"]: p for p in doc["reference_points"]}
    dflt = doc["defaults_check"]["hpa_default_target"]
    print(_row("slotwise", None, ref["slotwise"], "(defaults)"))
    print(_row("hpa", dflt, ref["hpa"], "(defaults)"))
    if "oracle" in ref:
        print(_row("oracle", None, ref["oracle"], "(per-tick, zero cold start)"))
    for name, pts in doc["curves"].items():
        for p in pts:
            print(_row(name, p["knob"], p, p["off_curve"] or "on the curve"))
    sw = ref["slotwise"]
    print(f"  slotwise's point: {sw['gpu_hours']:.2f} GPU-h, {sw['violating_requests']:,.0f} violating requests")
    for name, c in doc["comparisons"].items():
        print(f"  {name:<11} {c['verdict']:<5} " + describe(c, sw))
        for note in c["notes"]:
            print(f"  {'':<17} ({note})")
    d = doc["defaults_check"]
    print(f"  defaults: slotwise vs hpa at its defaults (target {dflt:g}): {d['verdict']} -- {d['why']}")
    a = doc["attainment_check"]
    ref_txt = "lower bound" if a["reference"] == "lower bound" else "oracle (the scorecard has no lower bound)"
    print(f"  attainment: {a['verdict']} -- {a['attainment']:.4f} of requests in SLO-meeting model-minutes "
          f"(need >= {MIN_ATTAINMENT}) at {_f(a['vs_reference'], '.3f')}x the {ref_txt} (need <= {MAX_VS_BOUND}x)")


def describe(c: dict[str, Any], sw: dict[str, Any]) -> str:
    """One comparison in words: the curve read at slotwise's violations and at its GPU-hours."""
    parts = []
    if c["saving"] is not None:
        where = ("at the least-violating point" if c["saving_at_end"]
                 else f"at {sw['violating_requests']:,.0f} violating")
        parts.append(f"{where} the curve needs {c['curve_gpu_hours']:.2f} GPU-h -> saving {c['saving']:.1%}"
                     f"{' (a lower bound)' if c['saving_at_end'] else ''} (need >= {MIN_SAVING:.0%})")
    if c["violation_ratio"] is not None:
        where = "at the cheapest point" if c["ratio_at_end"] else f"at {sw['gpu_hours']:.2f} GPU-h"
        parts.append(f"{where} the curve has {c['curve_violations']:,.0f} violating -> ratio "
                     f"{c['violation_ratio']:.3f}{' (an upper bound)' if c['ratio_at_end'] else ''} "
                     f"(need <= {MAX_RATIO:.3f})")
    return "; ".join(parts) or "no comparison"


def print_summary(docs: list[dict[str, Any]]) -> None:
    if not docs:
        return
    names = list(docs[0]["comparisons"])
    print("\nsummary (frontier: saving at equal violations / violation ratio at equal GPU-hours)")
    print(f"  {'trace':<24}" + "".join(f"{n:>26}" for n in names) + f"{'defaults vs hpa':>17}{'attainment':>12}")
    for d in docs:
        cells = []
        for n in names:
            c = d["comparisons"][n]
            s = "-" if c["saving"] is None else f"{c['saving']:+.1%}"
            r = "-" if c["violation_ratio"] is None else f"{c['violation_ratio']:.2f}"
            cells.append(f"{c['verdict']} {s} / {r}")
        print(f"  {d['label']:<24}" + "".join(f"{x:>26}" for x in cells)
              + f"{d['defaults_check']['verdict']:>17}{d['attainment_check']['verdict']:>12}")
    every = [c["verdict"] for d in docs for c in d["comparisons"].values()]
    print(f"  overall frontier target: {'PASS' if every and all(v == 'PASS' for v in every) else 'FAIL'} "
          "(every baseline on every trace)")
