"""Trace readers and writers.

Every reader returns one of the two canonical shapes in :mod:`forecasting.traces.model`
(RequestLog, RateSeries) -- or, for the Alibaba GPU cluster tables, a NodeTable / PodTable -- and
raises TraceFormatError (file, 1-based line, field) on malformed input.

``resolve_trace("azure-llm-2023")`` loads a trace bundled with the package by name;
``resolve_trace(path)`` loads any supported file or folder.
"""

from __future__ import annotations

from pathlib import Path

from forecasting.traces._io import strip_suffixes
from forecasting.traces.alibaba import NodeTable, PodTable, read_nodes, read_pods
from forecasting.traces.azure_functions import read_azure_functions
from forecasting.traces.azure_llm import read_azure_llm
from forecasting.traces.canonical import SIDE_SUFFIX, read_rates, read_requests, write_rates, write_requests
from forecasting.traces.convert import to_rate_series
from forecasting.traces.model import RateSeries, RequestLog, Trace, TraceFormatError
from forecasting.traces.mooncake import read_mooncake
from forecasting.traces.registry import FORMATS, Loaded, TraceFormat, detect_format, format_named, load_trace
from forecasting.traces.servegen import read_servegen

__all__ = [
    "FORMATS",
    "Loaded",
    "NodeTable",
    "PodTable",
    "RateSeries",
    "RequestLog",
    "Trace",
    "TraceFormat",
    "TraceFormatError",
    "bundled_traces",
    "detect_format",
    "format_named",
    "load_trace",
    "read_azure_functions",
    "read_azure_llm",
    "read_mooncake",
    "read_nodes",
    "read_pods",
    "read_rates",
    "read_requests",
    "read_servegen",
    "resolve_trace",
    "to_rate_series",
    "write_rates",
    "write_requests",
]


def bundled_dir() -> Path:
    """``forecasting/data/traces``: the trace slices shipped with the package (attribution beside them). Located
    through the package's own path rather than importlib.resources, whose namespace-path handling breaks under
    editable installs + pytest."""
    return Path(__file__).resolve().parent.parent / "data" / "traces"


def bundled_traces() -> dict[str, Path]:
    """Traces shipped with the package, by name: file ``azure_llm_2023.csv`` -> ``azure-llm-2023``.

    Any canonical ``*.csv`` / ``*.csv.gz`` dropped into ``forecasting/data/traces`` is picked up;
    per-model side files (``*.models.csv``) are not traces of their own.
    """
    folder = bundled_dir()
    if not folder.is_dir():
        return {}
    out: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        low = p.name.lower()
        if not low.endswith((".csv", ".csv.gz")) or SIDE_SUFFIX in low:
            continue
        out[strip_suffixes(p).replace("_", "-").lower()] = p
    return out


def resolve_trace(name_or_path: str | Path, fmt: str | None = None) -> Trace:
    """A bundled trace by name, else a file/folder path; must be traffic (not a cluster table)."""
    path = Path(name_or_path)
    if not path.exists():
        key = str(name_or_path).strip().lower().replace("_", "-")
        bundled = bundled_traces()
        if key not in bundled:
            known = ", ".join(bundled) or "none"
            raise FileNotFoundError(f"{name_or_path}: no such file, nor a bundled trace ({known})")
        path = bundled[key]
    trace = load_trace(path, fmt)
    if not isinstance(trace, (RequestLog, RateSeries)):
        raise TraceFormatError(
            str(path), None, None, f"is a {type(trace).__name__} (cluster table), not a traffic trace"
        )
    return trace
