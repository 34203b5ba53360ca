"""Format registry and auto-detection: ``load_trace(path)`` reads any supported trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from forecasting.traces._io import is_number, sniff_header
from forecasting.traces.alibaba import NodeTable, PodTable, read_nodes, read_pods
from forecasting.traces.azure_functions import count_columns, read_azure_functions
from forecasting.traces.azure_llm import read_azure_llm
from forecasting.traces.canonical import read_rates, read_requests
from forecasting.traces.model import RateSeries, RequestLog, TraceFormatError
from forecasting.traces.mooncake import read_mooncake
from forecasting.traces.servegen import chunk_files, read_servegen

Kind = Literal["requests", "rates", "nodes", "pods"]
Loaded = RequestLog | RateSeries | NodeTable | PodTable


@dataclass(frozen=True)
class TraceFormat:
    name: str
    kind: Kind
    read: Callable[[Path], Loaded]
    description: str


FORMATS: dict[str, TraceFormat] = {
    f.name: f
    for f in (
        TraceFormat("requests", "requests", read_requests, "canonical request log t,model[,tokens][,service_s]"),
        TraceFormat("rates", "rates", read_rates, "canonical rate series t,model,rate"),
        TraceFormat("azure-llm-2023", "requests", read_azure_llm, "Azure LLM TIMESTAMP,ContextTokens,GeneratedTokens"),
        TraceFormat("azure-functions-2019", "rates", read_azure_functions, "Azure Functions per-minute invocations"),
        TraceFormat("servegen", "rates", read_servegen, "ServeGen folder of chunk-<id>-trace.csv windows"),
        TraceFormat("mooncake", "requests", read_mooncake, "Mooncake JSONL timestamp/input/output_length"),
        TraceFormat("alibaba-gpu-nodes", "nodes", read_nodes, "Alibaba GPU v2023 node list"),
        TraceFormat("alibaba-gpu-pods", "pods", read_pods, "Alibaba GPU v2023 pod list"),
    )
}


def detect_format(path: str | Path) -> str:
    """Guess the format from the folder contents, the extension, or the header line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if path.is_dir():
        return _detect_folder(path)
    low = path.name.lower()
    if low.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
        return "mooncake"
    head = sniff_header(path)
    if head is None:
        raise TraceFormatError(str(path), None, None, "empty file")
    h = [c.lower() for c in head]
    if head[0].startswith("{"):
        return "mooncake"
    if {"t", "model", "rate"} <= set(h):
        return "rates"
    if {"t", "model"} <= set(h):
        return "requests"
    if h[0] == "timestamp" and "contexttokens" in h:
        return "azure-llm-2023"
    if "hashfunction" in h and count_columns(head):
        return "azure-functions-2019"
    if h[0] == "sn" and "gpu" in h:
        return "alibaba-gpu-nodes"
    if {"num_gpu", "gpu_milli"} <= set(h):
        return "alibaba-gpu-pods"
    if len(head) == 6 and is_number(head[0]):
        return "servegen"
    raise TraceFormatError(
        str(path), 1, None, f"unrecognised trace format (header: {','.join(head)[:120]}); name it with --from"
    )


def _detect_folder(path: Path) -> str:
    try:
        chunk_files(path)
        return "servegen"
    except TraceFormatError:
        pass
    names = [p.name.lower() for p in path.iterdir() if p.is_file()]
    if any(n.startswith("invocations") and n.endswith((".csv", ".csv.gz")) for n in names):
        return "azure-functions-2019"
    for p in sorted(path.iterdir()):
        if p.is_file() and p.name.lower().endswith((".csv", ".csv.gz")):
            head = sniff_header(p)
            if head and head[0].lower() == "timestamp":
                return "azure-llm-2023"
    raise TraceFormatError(
        str(path),
        None,
        None,
        "folder holds no recognised trace (ServeGen chunks, Azure invocations, Azure LLM)",
    )


def format_named(name: str) -> TraceFormat:
    key = name.strip().lower().replace("_", "-")
    if key not in FORMATS:
        raise TraceFormatError(name, None, None, f"unknown trace format (known: {', '.join(FORMATS)})")
    return FORMATS[key]


def load_trace(path: str | Path, fmt: str | None = None) -> Loaded:
    """Read ``path`` (file or folder) in format ``fmt`` (a FORMATS key), auto-detected when None."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    spec = format_named(fmt if fmt is not None else detect_format(path))
    try:
        return spec.read(path)
    except (FileNotFoundError, TraceFormatError):
        raise
    except OSError as e:
        # Permission problems, a folder where a file was expected, truncated gzip ... are still
        # "this trace cannot be read" for the caller, who reports TraceFormatError cleanly.
        raise TraceFormatError(str(path), None, None, f"cannot read ({e.strerror or e})") from e
