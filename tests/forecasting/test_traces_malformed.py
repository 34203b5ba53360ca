"""Malformed traces: every reader raises TraceFormatError naming the file, the 1-based line and the
field -- never a bare numpy / csv / json traceback."""

from __future__ import annotations

import gzip
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forecasting.traces import (
    TraceFormatError,
    detect_format,
    load_trace,
    read_azure_functions,
    read_azure_llm,
    read_mooncake,
    read_nodes,
    read_pods,
    read_rates,
    read_requests,
    read_servegen,
)

H64 = "ab" * 32
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
FN = "HashOwner,HashApp,HashFunction,Trigger,1,2,3\n"
NODES = "sn,cpu_milli,memory_mib,gpu,model\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
MC = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}\n'

Reader = Callable[[Path], object]

# (id, reader, file name, content, line, field, message fragment)
CASES: list[tuple[str, Reader, str, str, int | None, str | None, str]] = [
    # --- canonical request log
    ("req-empty", read_requests, "r.csv", "", None, None, "empty file"),
    ("req-header-only", read_requests, "r.csv", "t,model\n", 2, None, "no data rows"),
    ("req-no-model-col", read_requests, "r.csv", "t,input_tokens\n0,1\n", 1, "model", "missing column"),
    ("req-no-t-col", read_requests, "r.csv", "time,model\n0,m\n", 1, "t", "missing column"),
    ("req-bad-t", read_requests, "r.csv", "t,model\n0,m\n1,m\nabc,m\n", 4, "t", "not a number"),
    ("req-empty-t", read_requests, "r.csv", "t,model\n0,m\n,m\n", 3, "t", "missing value"),
    ("req-negative-t", read_requests, "r.csv", "t,model\n-1,m\n", 2, "t", "negative"),
    ("req-nan-t", read_requests, "r.csv", "t,model\n0,m\nnan,m\n", 3, "t", "NaN"),
    ("req-inf-t", read_requests, "r.csv", "t,model\n0,m\ninf,m\n", 3, "t", "infinite"),
    ("req-backwards", read_requests, "r.csv", "t,model\n0,m\n5,m\n4,m\n", 4, "t", "backwards"),
    ("req-empty-model", read_requests, "r.csv", "t,model\n0,m\n1, \n", 3, "model", "empty model"),
    (
        "req-short-row",
        read_requests,
        "r.csv",
        "t,model,input_tokens\n0,m,1\n1,m\n",
        3,
        "input_tokens",
        "missing",
    ),
    ("req-long-row", read_requests, "r.csv", "t,model\n0,m\n1,m,9\n", 3, None, "too many fields"),
    (
        "req-frac-tokens",
        read_requests,
        "r.csv",
        "t,model,output_tokens\n0,m,1.5\n",
        2,
        "output_tokens",
        "integer",
    ),
    (
        "req-neg-tokens",
        read_requests,
        "r.csv",
        "t,model,input_tokens\n0,m,2\n0,m,-3\n",
        3,
        "input_tokens",
        "negative",
    ),
    (
        "req-bad-service",
        read_requests,
        "r.csv",
        "t,model,service_s\n0,m,fast\n",
        2,
        "service_s",
        "not a number",
    ),
    ("req-dup-column", read_requests, "r.csv", "t,model,t\n0,m,0\n", 1, "t", "duplicate column"),
    ("req-blank-lines-counted", read_requests, "r.csv", "t,model\n\n0,m\n\nx,m\n", 5, "t", "not a number"),
    # --- canonical rate series
    ("rate-no-rate-col", read_rates, "s.csv", "t,model\n0,m\n", 1, "rate", "missing column"),
    ("rate-bad-rate", read_rates, "s.csv", "t,model,rate\n0,m,1\n60,m,lots\n", 3, "rate", "not a number"),
    ("rate-negative-rate", read_rates, "s.csv", "t,model,rate\n0,m,1\n60,m,-2\n", 3, "rate", "negative"),
    ("rate-dup-time", read_rates, "s.csv", "t,model,rate\n0,m,1\n60,m,1\n60,m,2\n", 4, "t", "duplicate time"),
    ("rate-backwards", read_rates, "s.csv", "t,model,rate\n0,a,1\n120,a,1\n60,a,2\n", 4, "t", "backwards"),
    ("rate-off-grid", read_rates, "s.csv", "t,model,rate\n0,a,1\n60,a,1\n0,b,1\n90,b,1\n", 5, "t", "grid"),
    ("rate-off-grid-step", read_rates, "s.csv", "t,model,rate\n0,a,1\n60,a,1\n150,a,1\n", 4, "t", "grid"),
    ("rate-single-points", read_rates, "s.csv", "t,model,rate\n0,a,1\n0,b,2\n", None, "t", "infer the step"),
    ("rate-negative-t", read_rates, "s.csv", "t,model,rate\n-60,m,1\n0,m,1\n", 2, "t", "negative"),
    # --- Azure LLM
    ("az-empty", read_azure_llm, "a.csv", "", None, None, "empty file"),
    (
        "az-no-tokens",
        read_azure_llm,
        "a.csv",
        "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.97,1\n",
        1,
        "GeneratedTokens",
        "missing column",
    ),
    (
        "az-bad-stamp",
        read_azure_llm,
        "a.csv",
        AZ + "2023-11-16 18:17:03.97,1,2\n2023-13-16 00:00:00,1,2\n",
        3,
        "TIMESTAMP",
        "not a timestamp",
    ),
    (
        "az-empty-stamp",
        read_azure_llm,
        "a.csv",
        AZ + "2023-11-16 18:17:03,1,2\n,1,2\n",
        3,
        "TIMESTAMP",
        "missing",
    ),
    (
        "az-backwards",
        read_azure_llm,
        "a.csv",
        AZ + "2023-11-16 18:17:03,1,2\n2023-11-16 18:17:02,1,2\n",
        3,
        "TIMESTAMP",
        "backwards",
    ),
    (
        "az-bad-tokens",
        read_azure_llm,
        "a.csv",
        AZ + "2023-11-16 18:17:03,1,2\n2023-11-16 18:17:04,x,2\n",
        3,
        "ContextTokens",
        "not a number",
    ),
    (
        "az-neg-tokens",
        read_azure_llm,
        "a.csv",
        AZ + "2023-11-16 18:17:03,1,-2\n",
        2,
        "GeneratedTokens",
        "negative",
    ),
    # --- Azure Functions
    (
        "fn-no-hash",
        read_azure_functions,
        "invocations.csv",
        "HashOwner,1,2\no,1,2\n",
        1,
        "HashFunction",
        "missing",
    ),
    (
        "fn-no-counts",
        read_azure_functions,
        "invocations.csv",
        f"HashFunction,Trigger\n{H64},http\n",
        1,
        None,
        "count columns",
    ),
    (
        "fn-bad-count",
        read_azure_functions,
        "invocations.csv",
        FN + f"o,a,{H64},http,1,2,3\no,a,{H64},http,1,x,3\n",
        3,
        "2",
        "not a number",
    ),
    (
        "fn-neg-count",
        read_azure_functions,
        "invocations.csv",
        FN + f"o,a,{H64},http,1,2,-3\n",
        2,
        "3",
        "negative",
    ),
    (
        "fn-empty-count",
        read_azure_functions,
        "invocations.csv",
        FN + f"o,a,{H64},http,1,,3\n",
        2,
        "2",
        "missing",
    ),
    (
        "fn-short-row",
        read_azure_functions,
        "invocations.csv",
        FN + f"o,a,{H64},http,1,2\n",
        2,
        "3",
        "missing",
    ),
    (
        "fn-minutes-order",
        read_azure_functions,
        "invocations.csv",
        f"HashFunction,minute_2,minute_1\n{H64},1,2\n",
        1,
        "minute_1",
        "increasing",
    ),
    (
        "fn-empty-hash",
        read_azure_functions,
        "invocations.csv",
        FN + "o,a,,http,1,2,3\n",
        2,
        "HashFunction",
        "missing",
    ),
    # --- ServeGen (no header)
    (
        "sg-bad-rate",
        read_servegen,
        "chunk-1-trace.csv",
        "0,0,0,,0,0\n600,fast,1,Gamma,1,1\n",
        2,
        "rate_req_per_s",
        "not a number",
    ),
    ("sg-few-fields", read_servegen, "chunk-1-trace.csv", "0,0,0\n600,0,0\n", 1, "iat_dist", "3 of 6 fields"),
    ("sg-ragged", read_servegen, "chunk-1-trace.csv", "0,0,0,,0,0\n600,0,0,,0\n", 2, "param2", "missing"),
    ("sg-neg-t", read_servegen, "chunk-1-trace.csv", "-600,0,0,,0,0\n0,0,0,,0,0\n", 1, "t_s", "negative"),
    (
        "sg-backwards",
        read_servegen,
        "chunk-1-trace.csv",
        "0,0,0,,0,0\n1200,0,0,,0,0\n600,0,0,,0,0\n",
        3,
        "t_s",
        "backwards",
    ),
    (
        "sg-bad-dist",
        read_servegen,
        "chunk-1-trace.csv",
        "0,0,0,,0,0\n600,1,1,Ga mma,1,1\n",
        2,
        "iat_dist",
        "distribution",
    ),
    ("sg-empty", read_servegen, "chunk-1-trace.csv", "", None, None, "no data rows"),
    # --- Mooncake
    ("mc-empty", read_mooncake, "m.jsonl", "\n", None, None, "empty file"),
    ("mc-bad-json", read_mooncake, "m.jsonl", MC + '{"timestamp": 1,\n', 2, None, "invalid JSON"),
    ("mc-not-object", read_mooncake, "m.jsonl", MC + "[1, 2]\n", 2, None, "JSON object"),
    (
        "mc-missing-key",
        read_mooncake,
        "m.jsonl",
        MC + '{"timestamp": 5, "input_length": 1}\n',
        2,
        "output_length",
        "missing field",
    ),
    (
        "mc-bad-time",
        read_mooncake,
        "m.jsonl",
        MC + '{"timestamp": "soon", "input_length": 1, "output_length": 1}\n',
        2,
        "timestamp",
        "not a number",
    ),
    (
        "mc-backwards",
        read_mooncake,
        "m.jsonl",
        '{"timestamp": 10, "input_length": 1, "output_length": 1}\n' + MC,
        2,
        "timestamp",
        "backwards",
    ),
    (
        "mc-negative",
        read_mooncake,
        "m.jsonl",
        '{"timestamp": -1, "input_length": 1, "output_length": 1}\n',
        1,
        "timestamp",
        "negative",
    ),
    (
        "mc-frac-len",
        read_mooncake,
        "m.jsonl",
        MC + '{"timestamp": 1, "input_length": 1.5, "output_length": 1}\n',
        2,
        "input_length",
        "integer",
    ),
    (
        "mc-bad-hashes",
        read_mooncake,
        "m.jsonl",
        MC + '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": "x"}\n',
        2,
        "hash_ids",
        "list",
    ),
    # --- Alibaba tables
    ("nodes-no-gpu-col", read_nodes, "n.csv", "sn,cpu_milli,memory_mib\nn,1,1\n", 1, "gpu", "missing column"),
    ("nodes-bad-gpu", read_nodes, "n.csv", NODES + "n0,1,1,2,T4\nn1,1,1,two,T4\n", 3, "gpu", "not a number"),
    ("nodes-empty-name", read_nodes, "n.csv", NODES + ",1,1,2,T4\n", 2, "sn", "missing"),
    (
        "pods-milli-range",
        read_pods,
        "p.csv",
        PODS + "p,1,1,1,1500,,LS,Running,0,1,0\n",
        2,
        "gpu_milli",
        "above",
    ),
    (
        "pods-bad-time",
        read_pods,
        "p.csv",
        PODS + "p,1,1,1,500,,LS,Running,zero,1,0\n",
        2,
        "creation_time",
        "not a number",
    ),
    (
        "pods-neg-cpu",
        read_pods,
        "p.csv",
        PODS + "p,-1,1,1,500,,LS,Running,0,1,0\n",
        2,
        "cpu_milli",
        "negative",
    ),
]


@pytest.mark.parametrize(
    ("reader", "name", "content", "line", "field", "fragment"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_malformed(
    tmp_path: Path,
    reader: Reader,
    name: str,
    content: str,
    line: int | None,
    field: str | None,
    fragment: str,
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceFormatError) as info:
        reader(path)
    err = info.value
    assert err.path == str(path)
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert fragment.lower() in err.message.lower(), str(err)
    # The rendered message carries all three for the CLI's one-line report.
    assert str(path) in str(err)
    if line is not None:
        assert f"{path}:{line}" in str(err)
    if field is not None:
        assert f"'{field}'" in str(err)


def test_companion_file_errors_name_the_companion(tmp_path: Path) -> None:
    (tmp_path / "invocations.csv").write_text(FN + f"o,a,{H64},http,1,2,3\n")
    bad = tmp_path / "durations.csv"
    bad.write_text(f"HashOwner,HashApp,HashFunction,Average\no,a,{H64},slow\n")
    with pytest.raises(TraceFormatError) as info:
        read_azure_functions(tmp_path)
    assert info.value.path == str(bad) and info.value.line == 2 and info.value.field == "Average"
    bad.write_text("Something,Average\nx,1\n")
    with pytest.raises(TraceFormatError, match="key columns"):
        read_azure_functions(tmp_path)


def test_side_file_error(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("t,model,rate\n0,m,1\n60,m,2\n")
    side = tmp_path / "s.models.csv"
    side.write_text("name,x\nm,1\n")
    with pytest.raises(TraceFormatError) as info:
        read_rates(tmp_path / "s.csv")
    assert info.value.path == str(side) and info.value.field == "model"


def test_not_utf8_and_corrupt_gzip(tmp_path: Path) -> None:
    p = tmp_path / "r.csv"
    p.write_bytes(b"t,model\n0,\xff\xfe\n")
    with pytest.raises(TraceFormatError, match="UTF-8"):
        read_requests(p)
    g = tmp_path / "r.csv.gz"
    g.write_bytes(b"not gzip at all")
    with pytest.raises(TraceFormatError, match="gzip"):
        read_requests(g)
    truncated = tmp_path / "t.csv.gz"
    truncated.write_bytes(gzip.compress(b"t,model\n" + b"0,m\n" * 1000)[:-20])
    with pytest.raises(TraceFormatError):
        read_requests(truncated)


def test_folders_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError):
        read_requests(tmp_path / "nope.csv")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceFormatError, match="no recognised trace"):
        load_trace(empty)
    with pytest.raises(TraceFormatError, match="no chunk"):
        read_servegen(empty)
    with pytest.raises(TraceFormatError, match="invocations"):
        read_azure_functions(empty)
    with pytest.raises(TraceFormatError, match="Azure LLM"):
        read_azure_llm(empty)
    with pytest.raises(TraceFormatError, match="directory"):
        load_trace(empty, "requests")


def test_unrecognised_and_unknown_format(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("foo,bar\n1,2\n")
    with pytest.raises(TraceFormatError) as info:
        detect_format(p)
    assert info.value.line == 1 and "--from" in info.value.message
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        load_trace(p, "parquet")
    e = tmp_path / "e.csv"
    e.write_text("")
    with pytest.raises(TraceFormatError, match="empty"):
        load_trace(e)


# ---------------------------------------------------------------- fuzz: never a bare traceback

_SEEDS = {
    "requests": ("r.csv", "t,model,input_tokens,output_tokens,service_s\n0,a,1,2,0.5\n1.5,b,3,4,\n"),
    "rates": ("s.csv", "t,model,rate,cv\n0,a,1,0.5\n60,a,2,\n0,b,0,1\n"),
    "azure-llm-2023": ("a.csv", AZ + "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.03,3180,8\n"),
    "azure-functions-2019": ("invocations.csv", FN + f"o,a,{H64},http,1,0,3\n"),
    "servegen": ("chunk-3-trace.csv", "0,0,0,,0,0\n600,1.5,1.2,Gamma,0.7,0.04\n"),
    "mooncake": (
        "m.jsonl",
        MC + '{"timestamp": 5, "input_length": 2, "output_length": 3, "hash_ids": [1]}\n',
    ),
    "alibaba-gpu-nodes": ("n.csv", NODES + "n0,1000,1024,2,T4\n"),
    "alibaba-gpu-pods": ("p.csv", PODS + "p,1,1,1,500,,LS,Running,0,1,\n"),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(_SEEDS)), data=st.data())
def test_fuzzed_files_raise_only_trace_errors(tmp_path: Path, fmt: str, data: st.DataObject) -> None:
    """Mutate a valid file (drop / duplicate / replace characters): the reader either succeeds or
    raises TraceFormatError -- nothing else escapes."""
    name, text = _SEEDS[fmt]
    chars = list(text)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, max(len(chars) - 1, 0)))
        op = data.draw(st.sampled_from(["drop", "dup", "swap"]))
        if not chars:
            break
        if op == "drop":
            del chars[i]
        elif op == "dup":
            chars.insert(i, chars[i])
        else:
            chars[i] = data.draw(st.sampled_from(list(',-.\n"x0 9{}:e')))
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / name
    path.write_text("".join(chars))
    try:
        load_trace(path, fmt)
    except TraceFormatError as e:
        assert e.path  # always names a file
