"""Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and later releases).

Each file is one service: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps such as
``2023-11-16 18:17:03.9799600``. Several files merge into one RequestLog, one model per file, on a
common time origin (the earliest timestamp of all files) so their relative timing is preserved.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from forecasting.traces._io import CsvTable, ints, parse_timestamps, read_csv, sniff_header, strip_suffixes
from forecasting.traces.model import RequestLog, TraceFormatError

TIME_COLUMN = "TIMESTAMP"
INPUT_COLUMN = "ContextTokens"
OUTPUT_COLUMN = "GeneratedTokens"
_FILE_PREFIX = "azurellminferencetrace_"


def model_name(path: Path) -> str:
    """``AzureLLMInferenceTrace_conv.csv`` -> ``conv``; ``..._code_1week.csv`` -> ``code_1week``;
    any other file keeps its whole stem."""
    stem = strip_suffixes(path)
    if stem.lower().startswith(_FILE_PREFIX) and len(stem) > len(_FILE_PREFIX):
        return stem[len(_FILE_PREFIX) :]
    return stem


def _header_index(table: CsvTable, name: str) -> int:
    # Case-insensitive: the dataset's releases are consistent, but hand-edited copies are not.
    lower = [h.lower() for h in table.header]
    if name.lower() not in lower:
        raise TraceFormatError(table.path, 1, name, f"missing column (header has: {', '.join(table.header)})")
    return lower.index(name.lower())


def files_in(path: Path) -> list[Path]:
    """The trace files of a folder: those whose header is the Azure LLM one, sorted by name."""
    found = []
    for p in sorted(path.iterdir()):
        if p.is_file() and p.name.lower().endswith((".csv", ".csv.gz")):
            head = sniff_header(p)
            if head is not None and [h.lower() for h in head[:1]] == [TIME_COLUMN.lower()]:
                found.append(p)
    if not found:
        raise TraceFormatError(str(path), None, None, "no Azure LLM trace files (TIMESTAMP,...) in folder")
    return found


def read_azure_llm(paths: str | Path | Sequence[str | Path]) -> RequestLog:
    """Read one file, a folder of them, or a list of files (merged as one model per file)."""
    if isinstance(paths, (str, Path)):
        p = Path(paths)
        files = files_in(p) if p.is_dir() else [p]
    else:
        files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no files given")

    stamps: list[np.ndarray] = []
    inputs: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    for f in files:
        table = read_csv(f)
        ts = parse_timestamps(table, _header_index(table, TIME_COLUMN), TIME_COLUMN)
        d = np.diff(ts)
        if (d < np.timedelta64(0, "ns")).any():
            i = int(np.argmax(d < np.timedelta64(0, "ns"))) + 1
            raise table.error(i, TIME_COLUMN, f"time goes backwards ({ts[i]} after {ts[i - 1]})")
        stamps.append(ts)
        inputs.append(ints(table, _header_index(table, INPUT_COLUMN), INPUT_COLUMN))
        outputs.append(ints(table, _header_index(table, OUTPUT_COLUMN), OUTPUT_COLUMN))

    names = _unique_names([model_name(f) for f in files])
    origin = min(s[0] for s in stamps)
    # Model order = order of first request, so writing and re-reading the canonical CSV (whose
    # models are listed in first-seen order) yields the same tuple.
    file_order = sorted(range(len(files)), key=lambda i: (stamps[i][0], i))
    models = tuple(names[i] for i in file_order)
    rank = {fi: r for r, fi in enumerate(file_order)}

    ns = np.concatenate([(s - origin).astype(np.int64) for s in stamps])
    codes = np.concatenate([np.full(len(s), rank[i], dtype=np.int32) for i, s in enumerate(stamps)])
    order = np.argsort(ns, kind="stable")
    return RequestLog(
        t=ns[order].astype(np.float64) / 1e9,
        model_index=codes[order],
        models=models,
        input_tokens=np.concatenate(inputs)[order],
        output_tokens=np.concatenate(outputs)[order],
        source=", ".join(str(f) for f in files),
        meta={
            "format": "azure-llm-2023",
            "origin": str(origin),
        },
    )


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    return out
