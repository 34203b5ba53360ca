"""``slotwise trace``: inspect traces and convert them to the canonical CSV formats.

    slotwise trace info FILE|FOLDER|BUNDLED-NAME [--from FORMAT] [--top N] [--step S]
    slotwise trace convert [--from FORMAT] [--to requests|rates] [--step S] IN OUT
    slotwise trace list

Malformed traces raise TraceFormatError (file, line, field), which ``slotwise`` reports with exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from forecasting.traces import (
    FORMATS,
    Loaded,
    NodeTable,
    PodTable,
    RateSeries,
    RequestLog,
    TraceFormatError,
    bundled_traces,
    detect_format,
    load_trace,
    to_rate_series,
    write_rates,
    write_requests,
)
from forecasting.traces.convert import rebin

DEFAULT_TOP = 10
DEFAULT_PEAK_STEP_S = 60.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="inspect traces and convert them to the canonical CSV formats")
    tsub = p.add_subparsers(dest="trace_command", required=True, metavar="{info,convert,list}")

    info = tsub.add_parser("info", help="describe a trace (kind, models, duration, rates, tokens)")
    info.add_argument("path", metavar="FILE", help="trace file or folder, or a bundled trace name")
    info.add_argument(
        "--from", dest="fmt", choices=list(FORMATS), default=None, help="format (default: detected)"
    )
    info.add_argument("--top", type=int, default=DEFAULT_TOP, help="models to list, busiest first")
    info.add_argument(
        "--step",
        type=float,
        default=DEFAULT_PEAK_STEP_S,
        help="bin width in seconds for the peak rate of a request log (default 60)",
    )
    info.set_defaults(func=cmd_info)

    conv = tsub.add_parser("convert", help="write a trace in the canonical request-log or rate CSV format")
    conv.add_argument("input", metavar="IN", help="trace file or folder, or a bundled trace name")
    conv.add_argument("output", metavar="OUT", help="output CSV (.csv.gz to compress)")
    conv.add_argument(
        "--from", dest="fmt", choices=list(FORMATS), default=None, help="format (default: detected)"
    )
    conv.add_argument(
        "--to",
        choices=("requests", "rates"),
        default=None,
        help="output kind (default: same kind as the input)",
    )
    conv.add_argument("--step", type=float, default=None, help="rate interval in seconds (with --to rates)")
    conv.set_defaults(func=cmd_convert)

    lst = tsub.add_parser("list", help="list the known formats and the bundled traces")
    lst.set_defaults(func=cmd_list)


def load(name_or_path: str, fmt: str | None) -> tuple[Loaded, Path, str]:
    """Load a path or a bundled trace name; returns the trace, its path and its format name."""
    path = Path(name_or_path)
    if not path.exists():
        bundled = bundled_traces()
        key = name_or_path.strip().lower().replace("_", "-")
        if key not in bundled:
            known = ", ".join(bundled) or "none"
            raise FileNotFoundError(f"{name_or_path}: no such file, nor a bundled trace ({known})")
        path = bundled[key]
    fmt = fmt or detect_format(path)
    return load_trace(path, fmt), path, fmt


# ---------------------------------------------------------------- convert


def cmd_convert(args: argparse.Namespace) -> int:
    trace, _path, fmt = load(args.input, args.fmt)
    if isinstance(trace, (NodeTable, PodTable)):
        raise TraceFormatError(
            str(args.input), None, None, f"{fmt} is a cluster table, not traffic: nothing to convert"
        )
    to = args.to or ("requests" if isinstance(trace, RequestLog) else "rates")
    if args.step is not None and not (np.isfinite(args.step) and args.step > 0):
        return _usage("--step must be a positive number of seconds")
    out = Path(args.output)
    if to == "requests":
        if not isinstance(trace, RequestLog):
            return _usage("a rate series cannot become a request log (use --to rates)")
        if args.step is not None:
            return _usage("--step only applies with --to rates")
        write_requests(trace, out)
        print(f"wrote {out}: request log, {len(trace.models)} models, {len(trace)} requests")
        return 0
    if isinstance(trace, RequestLog):
        if args.step is None:
            return _usage("binning a request log into rates needs --step SECONDS")
        series = to_rate_series(trace, args.step)
    else:
        series = trace
        if args.step is not None and args.step != series.step_s:
            factor = args.step / series.step_s
            if abs(factor - round(factor)) > 1e-9 or round(factor) < 1:
                return _usage(f"--step must be a whole multiple of the series step ({series.step_s:g} s)")
            series = rebin(series, round(factor))
    write_rates(series, out)
    shape = f"{len(series.models)} models x {series.n_steps} steps of {series.step_s:g} s"
    print(f"wrote {out}: rate series, {shape}")
    return 0


def _usage(message: str) -> int:
    print(f"slotwise trace convert: {message}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- info


def cmd_info(args: argparse.Namespace) -> int:
    trace, path, fmt = load(args.path, args.fmt)
    print(f"trace: {path}")
    print(f"format: {fmt}")
    if isinstance(trace, (NodeTable, PodTable)):
        lines = trace.describe()
    elif isinstance(trace, RequestLog):
        lines = describe_requests(trace, top=args.top, step_s=args.step)
    else:
        lines = describe_rates(trace, top=args.top)
    print("\n".join(lines))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    print("formats:")
    for f in FORMATS.values():
        print(f"  {f.name:<22} {f.kind:<9} {f.description}")
    print("bundled traces:")
    for name, p in bundled_traces().items():
        print(f"  {name:<22} {p}")
    return 0


def fmt_duration(seconds: float) -> str:
    s = round(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] if d else []
    parts += [f"{h}h"] if h or d else []
    parts += [f"{m}m", f"{s}s"]
    return " ".join(parts) + f" ({seconds:g} s)"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Plain aligned text: first column left-aligned (names), the rest right-aligned (numbers)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  " + "  ".join(parts)

    return [line(header), *(line(r) for r in rows)]


def _num(x: float) -> str:
    if not np.isfinite(x):
        return "-"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def _stats(name: str, v: np.ndarray) -> str:
    v = v[~np.isnan(v)] if v.dtype.kind == "f" else v
    if not len(v):
        return f"{name}: no values"
    p50, p99 = np.percentile(v, [50, 99])
    return (
        f"{name}: mean {_num(float(np.mean(v)))}, p50 {_num(float(p50))}, p99 {_num(float(p99))}, "
        f"max {_num(float(np.max(v)))}"
    )


def describe_requests(
    log: RequestLog, *, top: int = DEFAULT_TOP, step_s: float = DEFAULT_PEAK_STEP_S
) -> list[str]:
    n = len(log)
    duration = log.duration_s
    lines = [
        "kind: request log",
        f"models: {len(log.models)}",
        f"duration: {fmt_duration(duration)}",
        f"requests: {n}",
    ]
    if duration > 0:
        lines.append(f"mean rate: {_num(n / duration)} req/s")
    if log.input_tokens is not None:
        lines.append(_stats("input tokens", log.input_tokens))
    if log.output_tokens is not None:
        lines.append(_stats("output tokens", log.output_tokens))
    if log.service_s is not None:
        lines.append(_stats("service time (s)", log.service_s))
    if not n:
        return lines
    series = to_rate_series(log, step_s)
    counts = np.bincount(log.model_index, minlength=len(log.models))
    order = np.argsort(-counts, kind="stable")[: max(top, 0)]
    header = ["model", "requests", "mean req/s", f"peak req/s ({step_s:g} s)"]
    if log.input_tokens is not None:
        header.append("mean in tok")
    if log.output_tokens is not None:
        header.append("mean out tok")
    rows = []
    for m in order.tolist():
        mask = log.model_index == m
        row = [
            log.models[m],
            str(int(counts[m])),
            _num(counts[m] / duration) if duration > 0 else "-",
            _num(float(series.rates[m].max())),
        ]
        if log.input_tokens is not None:
            row.append(_num(float(log.input_tokens[mask].mean())) if mask.any() else "-")
        if log.output_tokens is not None:
            row.append(_num(float(log.output_tokens[mask].mean())) if mask.any() else "-")
        rows.append(row)
    lines.append(f"per model (busiest {len(rows)} of {len(log.models)}):")
    return lines + _table(header, rows)


def describe_rates(series: RateSeries, *, top: int = DEFAULT_TOP) -> list[str]:
    rates = series.rates
    totals = np.nansum(rates, axis=1) * series.step_s
    gaps = int(np.isnan(rates).sum())
    lines = [
        "kind: rate series",
        f"models: {len(series.models)}",
        f"step: {series.step_s:g} s x {series.n_steps} steps, starting at t={series.start_s:g} s",
        f"duration: {fmt_duration(series.duration_s)}",
        f"requests (rate x step): {totals.sum():.0f}",
    ]
    if series.duration_s > 0:
        lines.append(f"mean rate: {_num(float(totals.sum() / series.duration_s))} req/s (all models)")
    if gaps:
        lines.append(f"missing points: {gaps} of {rates.size}")
    active = int((np.nan_to_num(rates).sum(axis=1) > 0).sum())
    lines.append(f"active models: {active} of {len(series.models)}")
    extras = [k for k, v in series.meta.items() if isinstance(v, np.ndarray) and v.shape == rates.shape]
    if extras:
        lines.append(f"per-window columns: {', '.join(extras)}")
    durations = series.meta.get("duration_ms")
    if isinstance(durations, dict) and durations:
        lines.append(f"service-time priors (duration_ms) for {len(durations)} models")
    valid = ~np.isnan(rates)
    n_valid = valid.sum(axis=1)
    mean = np.where(n_valid > 0, np.nansum(rates, axis=1) / np.maximum(n_valid, 1), np.nan)
    if rates.shape[1]:
        peak = np.where(n_valid > 0, np.max(np.where(valid, rates, -np.inf), axis=1), np.nan)
    else:
        peak = mean
    order = np.argsort(-totals, kind="stable")[: max(top, 0)]
    header = ["model", "requests", "mean req/s", "peak req/s"]
    show_duration = isinstance(durations, dict) and bool(durations)
    if show_duration:
        header.append("mean ms")
    rows = []
    for m in order.tolist():
        name = series.models[m]
        row = [name, f"{totals[m]:.0f}", _num(float(mean[m])), _num(float(peak[m]))]
        if show_duration:
            assert isinstance(durations, dict)
            stats = durations.get(name)
            row.append(_num(float(stats.get("mean", np.nan))) if isinstance(stats, dict) else "-")
        rows.append(row)
    lines.append(f"per model (busiest {len(rows)} of {len(series.models)}):")
    return lines + _table(header, rows)
