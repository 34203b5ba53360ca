"""Mooncake request traces (kvcache-ai/Mooncake): JSON lines ->  RequestLog, one model per file.

Each line: ``{"timestamp": <ms>, "input_length": n, "output_length": n, "hash_ids": [...]}``.
Times become seconds from the first request. ``hash_ids`` (the prompt's KV-cache block hashes, for
prefix-cache studies) are kept compactly as ``meta["hash_ids"] = (values, offsets)``: request ``i``
owns ``values[offsets[i]:offsets[i + 1]]`` -- a tuple so the canonical writer, which exports 1-D
per-request arrays as columns, never mistakes the ragged list for one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from forecasting.traces._io import open_text, strip_suffixes
from forecasting.traces.model import RequestLog, TraceFormatError

REQUIRED = ("timestamp", "input_length", "output_length")


def read_mooncake(path: str | Path, model: str | None = None) -> RequestLog:
    path = Path(path)
    spath = str(path)
    ts: list[float] = []
    lengths: dict[str, list[int]] = {"input_length": [], "output_length": []}
    ids: list[int] = []
    offsets = [0]
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceFormatError(spath, lineno, None, f"invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(spath, lineno, None, "expected a JSON object per line")
            for key in REQUIRED:
                if key not in obj:
                    raise TraceFormatError(spath, lineno, key, "missing field")
            stamp = obj["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
                raise TraceFormatError(spath, lineno, "timestamp", f"not a number: {stamp!r}")
            if stamp < 0:
                raise TraceFormatError(spath, lineno, "timestamp", f"negative time {stamp}")
            if ts and stamp < ts[-1]:
                raise TraceFormatError(spath, lineno, "timestamp", f"time goes backwards ({stamp} after {ts[-1]})")
            ts.append(float(stamp))
            for key, out in lengths.items():
                out.append(_count(obj[key], spath, lineno, key))
            hashes = obj.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
                raise TraceFormatError(spath, lineno, "hash_ids", "expected a list of integers")
            ids.extend(hashes)
            offsets.append(len(ids))
    if not ts:
        raise TraceFormatError(spath, None, None, "empty file (no requests)")
    t_ms = np.asarray(ts, dtype=np.float64)
    name = model or strip_suffixes(path)
    return RequestLog(
        t=(t_ms - t_ms[0]) / 1000.0,
        model_index=np.zeros(len(t_ms), dtype=np.int32),
        models=(name,),
        input_tokens=np.asarray(lengths["input_length"], dtype=np.int64),
        output_tokens=np.asarray(lengths["output_length"], dtype=np.int64),
        source=spath,
        meta={
            "format": "mooncake",
            "origin_ms": float(t_ms[0]),
            "hash_ids": (np.asarray(ids, dtype=np.int64), np.asarray(offsets, dtype=np.int64)),
        },
    )


def _count(v: object, path: str, line: int, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise TraceFormatError(path, line, key, f"not an integer: {v!r}")
    if v < 0:
        raise TraceFormatError(path, line, key, f"negative value {v}")
    return int(v)
