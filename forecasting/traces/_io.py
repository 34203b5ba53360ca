"""Shared low-level helpers for the trace readers: opening (optionally gzip'd) text, reading CSV
tables while remembering line numbers, and vectorised column parsing that still reports the exact
line and field of the first bad value.

The pattern throughout: parse a whole column with numpy (fast), and only when that fails walk the
column value by value to find the first offender, so the common path stays vectorised while a bad
file still yields ``file:line: field 'x': ...`` rather than a numpy traceback.
"""

from __future__ import annotations

import csv
import gzip
import io
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from forecasting.traces.model import TraceFormatError

# Fields can be long (ServeGen params, Mooncake lines are read separately); raise the csv module's
# default 128 KiB cap so a legitimately wide invocations row never trips it.
csv.field_size_limit(1 << 26)


def is_gzip_path(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def strip_suffixes(path: Path) -> str:
    """File name without ``.gz`` and one data extension: ``a.csv.gz`` -> ``a``, ``b.jsonl`` -> ``b``."""
    name = path.name
    if name.lower().endswith(".gz"):
        name = name[:-3]
    stem, dot, _ext = name.rpartition(".")
    return stem if dot else name


@contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """Open a text trace, transparently gunzipping ``*.gz``; decoding problems become TraceFormatError.

    ``utf-8-sig`` drops a leading BOM, which spreadsheet exports often add and which would otherwise
    end up glued to the first header name.
    """
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise TraceFormatError(str(path), None, None, "is a directory, expected a file")
    raw = gzip.open(path, "rb") if is_gzip_path(path) else open(path, "rb")  # noqa: SIM115
    try:
        yield io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
    except UnicodeDecodeError as e:
        raise TraceFormatError(str(path), None, None, f"not UTF-8 text ({e.reason})") from e
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise TraceFormatError(str(path), None, None, f"corrupt gzip data ({e})") from e
    finally:
        raw.close()


@contextmanager
def open_text_write(path: Path) -> Iterator[TextIO]:
    """Open for writing; ``*.gz`` is gzip'd with a zero mtime so regenerated files are byte-identical."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_gzip_path(path):
        with (
            open(path, "wb") as f,
            gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz,
            io.TextIOWrapper(gz, encoding="utf-8", newline="") as text,
        ):
            yield text
    else:
        with open(path, "w", encoding="utf-8", newline="") as text:
            yield text


def sniff_header(path: Path) -> list[str] | None:
    """The first non-blank CSV row of ``path`` (stripped cells), or None for an empty file."""
    with open_text(path) as f:
        for line in f:
            if line.strip():
                try:
                    return [c.strip() for c in next(csv.reader([line]))]
                except csv.Error as e:
                    raise TraceFormatError(str(path), None, None, f"bad CSV ({e})") from e
    return None


@dataclass
class CsvTable:
    """A CSV file read into memory: header names, data rows, and each row's 1-based line number."""

    path: str
    header: list[str]
    rows: list[list[str]]
    lines: np.ndarray  # int64, 1-based physical line of each row
    matrix: np.ndarray | None = None  # float64 (rows, columns) when read with ``numeric``
    matrix_columns: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def index(self, name: str, *, required: bool = True) -> int | None:
        """Column position of ``name`` (exact, after whitespace stripping), or error/None if absent."""
        try:
            return self.header.index(name)
        except ValueError:
            if required:
                raise TraceFormatError(
                    self.path, 1, name, f"missing column (header has: {', '.join(self.header)})"
                ) from None
            return None

    def column(self, idx: int) -> list[str]:
        return [r[idx] for r in self.rows]

    def error(self, row: int, field: str | None, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, int(self.lines[row]), field, message)


def read_csv(
    path: Path,
    *,
    header: bool = True,
    names: Sequence[str] | None = None,
    min_fields: int = 1,
    numeric: Callable[[list[str]], Sequence[int]] | None = None,
) -> CsvTable:
    """Read a whole CSV file. Blank lines are skipped; every row must have the header's field count.

    With ``header=False`` the columns are ``names`` (or ``col1..colN`` after the first row's width).
    ``numeric(header)`` picks columns to convert to float64 row by row as they are read, into
    ``table.matrix`` (those columns then leave ``header``/``rows``): wide per-minute count tables
    would otherwise hold one Python string per cell, gigabytes for a full-day Azure Functions file.
    """
    spath = str(path)
    rows: list[list[str]] = []
    lines: list[int] = []
    head: list[str] | None = None
    num_idx: list[int] = []
    keep_idx: list[int] = []
    matrix_rows: list[np.ndarray] = []
    with open_text(path) as f:
        reader = csv.reader(f)
        try:
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header and head is None:
                    head = _check_header(spath, reader.line_num, row)
                    if numeric is not None:
                        num_idx = list(numeric(head))
                        keep_idx = [i for i in range(len(head)) if i not in set(num_idx)]
                    continue
                if num_idx:
                    assert head is not None
                    _check_width(spath, reader.line_num, head, row)
                    matrix_rows.append(_float_row(spath, reader.line_num, head, row, num_idx))
                    row = [row[i] for i in keep_idx]
                rows.append(row)
                # line_num counts physical lines consumed, so it is the row's last line; rows with
                # embedded newlines are vanishingly rare in traces and then still point close by.
                lines.append(reader.line_num)
        except csv.Error as e:
            raise TraceFormatError(spath, reader.line_num, None, f"bad CSV ({e})") from e
    if header and head is None:
        raise TraceFormatError(spath, None, None, "empty file (no header)")
    if not rows:
        raise TraceFormatError(spath, 2 if header else None, None, "no data rows")
    if head is None:
        head = list(names) if names is not None else [f"col{i + 1}" for i in range(len(rows[0]))]
    if len(head) < min_fields:
        raise TraceFormatError(spath, 1, None, f"expected at least {min_fields} columns, got {len(head)}")
    if num_idx:
        table = CsvTable(spath, [head[i] for i in keep_idx], rows, np.asarray(lines, dtype=np.int64))
        table.matrix = np.vstack(matrix_rows)
        table.matrix_columns = [head[i] for i in num_idx]
        return table
    table = CsvTable(spath, head, rows, np.asarray(lines, dtype=np.int64))
    check_widths(table)
    return table


def _check_header(path: str, line: int, row: list[str]) -> list[str]:
    head = [h.strip() for h in row]
    if any(not h for h in head):
        pos = next(i for i, h in enumerate(head) if not h)
        raise TraceFormatError(path, line, f"#{pos + 1}", "empty column name")
    dupes = sorted({h for h in head if head.count(h) > 1})
    if dupes:
        raise TraceFormatError(path, line, dupes[0], "duplicate column name")
    return head


def _check_width(path: str, line: int, head: list[str], row: list[str]) -> None:
    n = len(head)
    if len(row) < n:
        raise TraceFormatError(path, line, head[len(row)], f"missing value (row has {len(row)} of {n} fields)")
    if len(row) > n:
        raise TraceFormatError(path, line, None, f"too many fields ({len(row)}, header has {n})")


def _float_row(path: str, line: int, head: list[str], row: list[str], idx: list[int]) -> np.ndarray:
    a = idx[0]
    cells = row[a : a + len(idx)] if idx[-1] - a == len(idx) - 1 else [row[i] for i in idx]
    try:
        return np.array(cells, dtype=np.float64)
    except ValueError:
        for i, v in zip(idx, cells, strict=True):
            try:
                float(v)
            except ValueError:
                msg = "missing value" if not v.strip() else f"not a number: {v!r}"
                raise TraceFormatError(path, line, head[i], msg) from None
        raise


def check_widths(table: CsvTable) -> None:
    for i, row in enumerate(table.rows):
        if len(row) != len(table.header):
            _check_width(table.path, int(table.lines[i]), table.header, row)


def _first_bad(values: Sequence[str]) -> int:
    for i, v in enumerate(values):
        try:
            float(v)
        except ValueError:
            return i
    return -1


def floats(
    table: CsvTable,
    idx: int,
    name: str,
    *,
    allow_empty: bool = False,
    min_value: float | None = None,
    finite: bool = True,
) -> np.ndarray:
    """Parse column ``idx`` as float64; empty cells become NaN only when ``allow_empty``."""
    values = table.column(idx)
    if allow_empty:
        values = [v if v.strip() else "nan" for v in values]
    try:
        arr = np.array(values, dtype=np.float64)
    except ValueError:
        bad = _first_bad(values)
        raw = table.rows[bad][idx]
        msg = "missing value" if not raw.strip() else f"not a number: {raw!r}"
        raise table.error(bad, name, msg) from None
    check_range(table, arr, name, allow_nan=allow_empty, min_value=min_value, finite=finite)
    return arr


def check_range(
    table: CsvTable,
    arr: np.ndarray,
    name: str,
    *,
    allow_nan: bool = False,
    min_value: float | None = None,
    finite: bool = True,
    rows: np.ndarray | None = None,
) -> None:
    """Reject NaN / inf / values below ``min_value``; ``rows`` maps arr positions to table rows."""
    nan = np.isnan(arr)
    bad = np.zeros(arr.shape, dtype=bool)
    if not allow_nan:
        bad |= nan
    if finite:
        bad |= np.isinf(arr)
    if min_value is not None:
        with np.errstate(invalid="ignore"):
            bad |= arr < min_value
    if bad.any():
        i = int(np.argmax(bad))
        v = arr[i]
        row = int(rows[i]) if rows is not None else i
        if np.isnan(v):
            msg = "missing value" if not table.rows[row][table.header.index(name)].strip() else "NaN not allowed"
        elif np.isinf(v):
            msg = "infinite value"
        else:
            msg = f"negative value {v:g}" if min_value == 0 else f"value {v:g} below {min_value:g}"
        raise table.error(row, name, msg)


def ints(table: CsvTable, idx: int, name: str, *, min_value: int | None = 0) -> np.ndarray:
    """Parse column ``idx`` as int64. Integral floats (``12.0``) are accepted because some tools
    write counts that way; fractional values are an error."""
    values = table.column(idx)
    try:
        arr = np.array(values, dtype=np.int64)
    except (ValueError, OverflowError):
        f = floats(table, idx, name, min_value=min_value)
        frac = f != np.floor(f)
        if frac.any():
            i = int(np.argmax(frac))
            raise table.error(i, name, f"not an integer: {table.rows[i][idx]!r}") from None
        big = np.abs(f) >= 2.0**62
        if big.any():
            i = int(np.argmax(big))
            raise table.error(i, name, f"integer out of range: {table.rows[i][idx]!r}") from None
        arr = f.astype(np.int64)
    if min_value is not None and (arr < min_value).any():
        i = int(np.argmax(arr < min_value))
        raise table.error(i, name, f"negative value {arr[i]}" if min_value == 0 else f"below {min_value}")
    return arr


def parse_timestamps(table: CsvTable, idx: int, name: str) -> np.ndarray:
    """Parse ISO-like timestamps (``2023-11-16 18:17:03.9799600``, optional ``T``/offset) to
    datetime64[ns]. numpy keeps up to 9 fractional digits, so the 7-digit Azure stamps are exact."""
    values = [v.strip() for v in table.column(idx)]

    def one(v: str) -> np.datetime64:
        if not v:
            raise ValueError("empty")
        with warnings.catch_warnings():
            # An explicit UTC offset makes numpy warn (it converts to UTC, which is what we want).
            warnings.simplefilter("ignore")
            out = np.datetime64(v, "ns")
        if np.isnat(out):
            raise ValueError("NaT")
        return out

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = np.array(values, dtype="datetime64[ns]")
        if np.isnat(arr).any():
            raise ValueError("NaT")
    except ValueError:
        for i, v in enumerate(values):
            try:
                one(v)
            except ValueError:
                msg = "missing value" if not v else f"not a timestamp: {table.rows[i][idx]!r}"
                raise table.error(i, name, msg) from None
        raise  # pragma: no cover - numpy and the per-value parser agree
    return arr


def check_non_decreasing(table: CsvTable, t: np.ndarray, name: str, rows: np.ndarray | None = None) -> None:
    """Arrival times must not go backwards: a decrease usually means a corrupted or concatenated file."""
    if len(t) < 2:
        return
    d = np.diff(t)
    if (d < 0).any():
        i = int(np.argmax(d < 0)) + 1
        row = int(rows[i]) if rows is not None else i
        raise table.error(row, name, f"time goes backwards ({t[i]} after {t[i - 1]})")


def fmt_float(x: float) -> str:
    """Shortest exact text for a float; integral values without ``.0``; NaN as an empty cell."""
    if x != x:  # NaN
        return ""
    if abs(x) < 1e15 and x == int(x):
        return str(int(x))
    return repr(float(x))


def fmt_time(x: float, decimals: int | None) -> str:
    if decimals is None:
        return fmt_float(x)
    return fmt_float(round(float(x), decimals))


def is_number(s: str) -> bool:
    """Whether a field parses as a number (how header sniffing tells a header row from data)."""
    try:
        float(s)
    except ValueError:
        return False
    return True
