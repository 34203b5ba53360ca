"""Trace readers on small fixtures and on the real shared traces, canonical round trips, bundles."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

from forecasting.traces import (
    FORMATS,
    NodeTable,
    PodTable,
    RateSeries,
    RequestLog,
    TraceFormatError,
    bundled_traces,
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
    resolve_trace,
    to_rate_series,
    write_rates,
    write_requests,
)
from forecasting.traces.azure_functions import function_names
from forecasting.traces.convert import rebin

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="shared trace data not available")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- canonical request log


def test_read_requests_minimal(tmp_path: Path) -> None:
    p = write(tmp_path / "r.csv", "t,model\n0,b\n0.5,a\n0.5,b\n2,a\n")
    log = read_requests(p)
    assert log.models == ("b", "a")  # first-seen order
    assert log.t.tolist() == [0, 0.5, 0.5, 2]
    assert log.model_index.tolist() == [0, 1, 0, 1]
    assert log.model_index.dtype == np.int32
    assert log.input_tokens is None and log.output_tokens is None and log.service_s is None
    assert len(log) == 4 and log.duration_s == 2


def test_read_requests_all_columns_and_extras(tmp_path: Path) -> None:
    p = write(
        tmp_path / "r.csv",
        "t,model,input_tokens,output_tokens,service_s,tenant\n0,m,10,2,0.25,x\n1,m,12.0,3,,y\n",
    )
    log = read_requests(p)
    assert log.input_tokens is not None and log.input_tokens.tolist() == [10, 12]
    assert log.input_tokens.dtype == np.int64
    assert log.output_tokens is not None and log.output_tokens.tolist() == [2, 3]
    assert log.service_s is not None and log.service_s[0] == 0.25 and np.isnan(log.service_s[1])
    assert log.meta["tenant"].tolist() == ["x", "y"]


def test_requests_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 100, 200)).round(6)
    log = RequestLog(
        t=t,
        model_index=rng.integers(0, 3, 200).astype(np.int32),
        models=("a", "b,c", "d"),
        input_tokens=rng.integers(1, 5000, 200),
        output_tokens=rng.integers(1, 500, 200),
        service_s=rng.uniform(0, 2, 200),
        meta={"prio": rng.integers(0, 3, 200).astype(np.float64), "cost": {"a": 1.5, "d": 2.0}},
    )
    # first-seen order must match for an exact comparison
    first = sorted(range(3), key=lambda m: int(np.argmax(log.model_index == m)))
    remap = np.argsort(first).astype(np.int32)
    log = RequestLog(
        t=log.t,
        model_index=remap[log.model_index],
        models=tuple(log.models[m] for m in first),
        input_tokens=log.input_tokens,
        output_tokens=log.output_tokens,
        service_s=log.service_s,
        meta=log.meta,
    )
    for name in ("r.csv", "r.csv.gz"):
        out = write_requests(log, tmp_path / name, t_decimals=None)
        back = read_requests(out)
        assert back.models == log.models
        np.testing.assert_array_equal(back.t, log.t)
        np.testing.assert_array_equal(back.model_index, log.model_index)
        np.testing.assert_array_equal(back.input_tokens, log.input_tokens)
        np.testing.assert_array_equal(back.output_tokens, log.output_tokens)
        np.testing.assert_array_equal(back.service_s, log.service_s)
        np.testing.assert_array_equal(back.meta["prio"], log.meta["prio"])
        assert back.meta["cost"] == {"a": 1.5, "d": 2.0}
    with gzip.open(tmp_path / "r.csv.gz", "rt") as f:
        assert f.readline().startswith("t,model")


def test_write_requests_rounds_to_microseconds(tmp_path: Path) -> None:
    log = RequestLog(t=np.array([0.0, 1.23456789]), model_index=np.zeros(2, np.int32), models=("m",))
    out = write_requests(log, tmp_path / "r.csv")
    assert out.read_text().splitlines()[2] == "1.234568,m"


# ---------------------------------------------------------------- canonical rate series


def test_read_rates_grid_gaps_and_order(tmp_path: Path) -> None:
    # b is listed first, a has a missing point and an explicit empty cell, rows interleaved.
    p = write(
        tmp_path / "s.csv",
        "t,model,rate\n0,b,0\n60,b,1\n0,a,0.5\n120,b,3\n120,a,\n180,a,2\n",
    )
    s = read_rates(p)
    assert s.models == ("b", "a")
    assert s.step_s == 60 and s.start_s == 0 and s.n_steps == 4
    np.testing.assert_array_equal(s.rates[0], [0, 1, 3, np.nan])
    np.testing.assert_array_equal(s.rates[1], [0.5, np.nan, np.nan, 2])


def test_read_rates_offset_start_and_float_step(tmp_path: Path) -> None:
    rows = "".join(f"{100 + 0.1 * k!r},m,{k}\n" for k in range(5))
    s = read_rates(write(tmp_path / "s.csv", "t,model,rate\n" + rows))
    assert s.start_s == 100 and s.step_s == pytest.approx(0.1) and s.n_steps == 5
    assert s.rates[0].tolist() == [0, 1, 2, 3, 4]


def test_rates_round_trip_with_extras_and_side_file(tmp_path: Path) -> None:
    rates = np.array([[0.0, 1.5, np.nan, 1 / 60], [2.0, 0.0, 0.25, 7.0]])
    series = RateSeries(
        rates=rates,
        models=("x", "y"),
        step_s=30.0,
        start_s=600.0,
        meta={
            "cv": np.array([[0, 1.1, np.nan, 2.0], [0.5, 0, 1, 3]]),
            "dist": np.array([["", "Gamma", "", "Weibull"], ["Gamma", "", "Gamma", "Gamma"]]),
            "duration_ms": {"x": {"mean": 12.5, "p99": 40.0}, "y": {"mean": 3.0}},
            "trigger": {"x": "http", "y": "timer"},
            "note": "dropped: not per model",
        },
    )
    for name in ("s.csv", "s.csv.gz"):
        out = write_rates(series, tmp_path / name)
        back = read_rates(out)
        assert back.models == series.models
        assert back.step_s == 30 and back.start_s == 600
        np.testing.assert_array_equal(back.rates, rates)
        np.testing.assert_array_equal(back.meta["cv"], series.meta["cv"])
        assert back.meta["dist"].tolist() == series.meta["dist"].tolist()  # type: ignore[union-attr]
        assert back.meta["duration_ms"] == series.meta["duration_ms"]
        assert back.meta["trigger"] == series.meta["trigger"]
    assert (tmp_path / "s.models.csv").is_file() and (tmp_path / "s.models.csv.gz").is_file()


def test_to_rate_series() -> None:
    log = RequestLog(
        t=np.array([0.0, 1.0, 9.99, 10.0, 25.0]),
        model_index=np.array([0, 1, 0, 0, 1], np.int32),
        models=("a", "b"),
        input_tokens=np.array([10, 20, 30, 40, 50]),
    )
    s = to_rate_series(log, 10.0)
    assert s.step_s == 10 and s.n_steps == 3 and s.models == ("a", "b")
    np.testing.assert_allclose(s.rates, [[0.2, 0.1, 0], [0.1, 0, 0.1]])
    mean_in = s.meta["mean_input_tokens"]
    assert isinstance(mean_in, np.ndarray)
    np.testing.assert_array_equal(mean_in, [[20, 40, np.nan], [20, np.nan, 50]])
    assert to_rate_series(log, 10.0, n_steps=1).rates.shape == (2, 1)
    with pytest.raises(ValueError):
        to_rate_series(log, 0)


def test_rebin() -> None:
    s = RateSeries(rates=np.array([[1.0, 3.0, 2.0, np.nan, 5.0]]), models=("m",), step_s=60)
    r = rebin(s, 2)
    assert r.step_s == 120 and r.n_steps == 2
    np.testing.assert_array_equal(r.rates, [[2.0, np.nan]])


# ---------------------------------------------------------------- Azure LLM


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_llm_single_and_merged(tmp_path: Path) -> None:
    code = write(
        tmp_path / "az" / "AzureLLMInferenceTrace_code.csv",
        AZ_HEADER + "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n",
    )
    write(
        tmp_path / "az" / "AzureLLMInferenceTrace_conv.csv",
        AZ_HEADER + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:17:04.0319600,396,109\n",
    )
    one = read_azure_llm(code)
    assert one.models == ("code",)
    assert one.t.tolist() == pytest.approx([0.0, 0.052])
    both = read_azure_llm(tmp_path / "az")
    assert both.models == ("conv", "code")  # by first request
    assert both.t[0] == 0 and both.t[1] == pytest.approx(77.29937)
    # ties keep file order (code before conv), tokens follow their requests
    assert [both.models[i] for i in both.model_index] == ["conv", "code", "code", "conv"]
    assert both.input_tokens is not None and both.input_tokens.tolist() == [374, 4808, 3180, 396]
    assert detect_format(tmp_path / "az") == "azure-llm-2023"
    assert detect_format(code) == "azure-llm-2023"
    assert both.meta["origin"].startswith("2023-11-16T18:15:46.68059")  # type: ignore[union-attr]


def test_azure_llm_other_stems_and_offsets(tmp_path: Path) -> None:
    p = write(
        tmp_path / "AzureLLMInferenceTrace_code_1week.csv",
        AZ_HEADER + "2024-05-10T00:00:00Z,1,2\n2024-05-10T00:00:01.5+00:00,3,4\n",
    )
    log = read_azure_llm(p)
    assert log.models == ("code_1week",)
    assert log.t.tolist() == [0, 1.5]
    other = write(tmp_path / "mytrace.csv", AZ_HEADER + "2024-05-10 00:00:00,1,2\n")
    assert read_azure_llm(other).models == ("mytrace",)


# ---------------------------------------------------------------- Azure Functions


def _hash(prefix: str) -> str:
    return (prefix * 64)[:64]


def test_azure_functions_layout_numbers_with_companions(tmp_path: Path) -> None:
    d = tmp_path / "fn"
    h1, h2 = "aaaaaaaa" + "1" * 56, "aaaaaaaa" + "2" * 56  # same 8-hex prefix: must disambiguate
    write(
        d / "invocations.csv",
        "HashOwner,HashApp,HashFunction,Trigger,10,11,12\n"
        f"o1,a1,{h1},http,60,0,120\n"
        f"o1,a2,{h2},timer,1,1,1\n",
    )
    write(
        d / "durations.csv",
        "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum,percentile_Average_0,"
        "percentile_Average_50,percentile_Average_99\n"
        f"o1,a1,{h1},100,5,10,900,10,80,850\n",
    )
    write(
        d / "memory.csv",
        "HashOwner,HashApp,SampleCount,AverageAllocatedMb,AverageAllocatedMb_pct50\no1,a2,7,128.5,120\n",
    )
    s = read_azure_functions(d)
    assert s.step_s == 60 and s.start_s == 0 and s.n_steps == 3
    assert len(set(s.models)) == 2 and all(m.startswith("fn-aaaaaaaa") for m in s.models)
    np.testing.assert_allclose(s.rates, [[1, 0, 2], [1 / 60] * 3])
    m1, m2 = s.models
    assert s.meta["hash_function"] == {m1: h1, m2: h2}
    assert s.meta["trigger"] == {m1: "http", m2: "timer"}
    assert s.meta["first_minute"] == 10
    assert s.meta["duration_ms"] == {
        m1: {"mean": 100, "count": 5, "min": 10, "max": 900, "p0": 10, "p50": 80, "p99": 850}
    }
    assert s.meta["memory_mb"] == {m2: {"count": 7, "mean": 128.5, "p50": 120}}  # joined per app
    assert detect_format(d) == "azure-functions-2019"
    assert detect_format(d / "invocations.csv") == "azure-functions-2019"


def test_azure_functions_minute_layout_and_gaps(tmp_path: Path) -> None:
    p = write(
        tmp_path / "invocations_per_function_md.anon.d01.csv",
        f"HashApp,HashFunction,Extra,minute_1,minute_2,minute_4\napp,{_hash('ab')},z,6,12,0\n",
    )
    write(
        tmp_path / "function_durations_percentiles.anon.d01.csv",
        f"HashApp,HashFunction,Average\napp,{_hash('ab')},7.5\n",
    )
    write(
        tmp_path / "function_durations_percentiles.anon.d02.csv",
        f"HashApp,HashFunction,Average\napp,{_hash('ab')},9\n",
    )
    s = read_azure_functions(p)
    assert s.models == ("fn-abababab",)
    np.testing.assert_array_equal(s.rates, [[0.1, 0.2, np.nan, 0.0]])
    assert s.meta["extra"] == {"fn-abababab": "z"}
    assert s.meta["duration_ms"] == {"fn-abababab": {"mean": 7.5}}  # same day only


def test_function_names_disambiguation() -> None:
    a, b = "0123456789ab" + "0" * 52, "0123456799ab" + "0" * 52
    names = function_names([a, b, a, "ffffffff" + "0" * 56])
    assert names == ["fn-0123456789ab", "fn-0123456799ab", "fn-0123456789ab-2", "fn-ffffffff"]


# ---------------------------------------------------------------- ServeGen


def test_servegen_folder(tmp_path: Path) -> None:
    d = tmp_path / "sg"
    write(d / "chunk-10-trace.csv", "0,0,0,,0,0\n600,1.5,1.2,Gamma,0.7,0.04\n1200,2,3.5,Weibull,0.2,0.001\n")
    write(d / "chunk-2-trace.csv", "0,0.5,0.9,Gamma,1,2\n600,0,0,,0,0\n1200,0,0,,0,0\n")
    write(d / "chunk-2-dataset.json", "{}")  # other ServeGen files are ignored
    s = read_servegen(d)
    assert s.models == ("client-2", "client-10")
    assert s.step_s == 600 and s.n_steps == 3
    np.testing.assert_array_equal(s.rates, [[0.5, 0, 0], [0, 1.5, 2]])
    cv = s.meta["cv"]
    assert isinstance(cv, np.ndarray) and cv.shape == (2, 3) and cv[1, 2] == 3.5
    dist = s.meta["iat_dist"]
    assert isinstance(dist, np.ndarray) and dist.tolist() == [["Gamma", "", ""], ["", "Gamma", "Weibull"]]
    assert detect_format(d) == "servegen"
    assert detect_format(d / "chunk-2-trace.csv") == "servegen"
    single = load_trace(d / "chunk-10-trace.csv")
    assert isinstance(single, RateSeries) and single.models == ("client-10",)


# ---------------------------------------------------------------- Mooncake


def test_mooncake(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 1000, "input_length": 100, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 30, "output_length": 7, "hash_ids": []},
        {"timestamp": 4000, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 2], "extra": 1},
    ]
    p = write(tmp_path / "conversation_trace.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    log = read_mooncake(p)
    assert log.models == ("conversation_trace",)
    assert log.t.tolist() == [0, 0.5, 3.0]
    assert log.input_tokens is not None and log.input_tokens.tolist() == [100, 30, 600]
    values, offsets = log.meta["hash_ids"]  # type: ignore[misc]
    assert values[offsets[2] : offsets[3]].tolist() == [0, 1, 2]
    assert detect_format(p) == "mooncake"


# ---------------------------------------------------------------- Alibaba GPU tables


def test_alibaba_nodes_and_pods(tmp_path: Path) -> None:
    nodes = write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,64000,262144,2,P100\nn2,96000,393216,8,G2\n",
    )
    pods = write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,12000,16384,1,1000,,LS,Running,0,100,0\n"
        "p1,6000,12288,1,460,,BE,Running,5,90,6\n"
        "p2,1000,1024,0,0,,LS,Pending,7,9,\n"
        "p3,8000,1024,2,1000,G2|T4,LS,Running,8,20,8\n",
    )
    nt = read_nodes(nodes)
    assert isinstance(nt, NodeTable) and len(nt) == 3 and nt.total_gpus == 10
    assert nt.gpus_by_model() == {"G2": 8, "P100": 2}
    pt = read_pods(pods)
    assert isinstance(pt, PodTable) and len(pt) == 4
    assert pt.sharing.tolist() == [False, True, False, False]
    assert pt.sharing_fraction == pytest.approx(1 / 3)
    assert pt.gpu_demand == pytest.approx(1 + 0.46 + 2)
    assert pt.allowed_models(3) == ("G2", "T4") and pt.allowed_models(0) == ()
    assert pt.scheduled_time is not None and np.isnan(pt.scheduled_time[2])
    assert any("GPU-sharing pods: 1" in line for line in pt.describe())
    assert detect_format(nodes) == "alibaba-gpu-nodes" and detect_format(pods) == "alibaba-gpu-pods"
    short = read_pods(
        write(tmp_path / "short.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,500\n")
    )
    assert short.creation_time is None and short.qos is None and short.gpu_spec.tolist() == [""]


# ---------------------------------------------------------------- registry, bundles


def test_formats_registry() -> None:
    assert set(FORMATS) == {
        "requests",
        "rates",
        "azure-llm-2023",
        "azure-functions-2019",
        "servegen",
        "mooncake",
        "alibaba-gpu-nodes",
        "alibaba-gpu-pods",
    }
    assert {f.kind for f in FORMATS.values()} == {"requests", "rates", "nodes", "pods"}


def test_detect_canonical(tmp_path: Path) -> None:
    assert detect_format(write(tmp_path / "a.csv", "t,model\n0,m\n")) == "requests"
    assert detect_format(write(tmp_path / "b.csv", "t,model,rate\n0,m,1\n")) == "rates"
    gz = tmp_path / "c.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write("t,model,rate\n0,m,1\n60,m,2\n")
    assert detect_format(gz) == "rates"
    s = load_trace(gz)
    assert isinstance(s, RateSeries) and s.rates.tolist() == [[1, 2]]


def test_bundled_traces_resolve() -> None:
    bundled = bundled_traces()
    assert {"azure-llm-2023", "azure-functions-2019", "servegen-m-small"} <= set(bundled)
    llm = resolve_trace("azure-llm-2023")
    assert isinstance(llm, RequestLog) and llm.models == ("conv", "code") and len(llm) == 28185
    assert llm.input_tokens is not None and llm.output_tokens is not None
    fn = resolve_trace("azure_functions_2019")
    assert isinstance(fn, RateSeries) and fn.rates.shape == (500, 480) and fn.step_s == 60
    durations = fn.meta["duration_ms"]
    assert isinstance(durations, dict) and len(durations) == 500
    assert all("mean" in v for v in durations.values())
    sg = resolve_trace("servegen-m-small")
    assert isinstance(sg, RateSeries) and sg.rates.shape == (43, 2016) and sg.step_s == 600
    assert isinstance(sg.meta["cv"], np.ndarray) and sg.meta["cv"].shape == (43, 2016)
    assert (Path(bundled["azure-llm-2023"]).parent / "ATTRIBUTION.md").is_file()


def test_resolve_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bundled"):
        resolve_trace("no-such-trace")
    nodes = write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\n")
    with pytest.raises(TraceFormatError, match="not a traffic trace"):
        resolve_trace(nodes)
    log = resolve_trace(write(tmp_path / "r.csv", "t,model\n0,m\n"))
    assert isinstance(log, RequestLog)


# ---------------------------------------------------------------- real shared files


@needs_shared
def test_real_azure_llm() -> None:
    start = time.perf_counter()
    log = load_trace(SHARED / "azure_llm_2023")
    assert time.perf_counter() - start < 2.0  # ~30 ms here; generous for slow CI runners
    assert isinstance(log, RequestLog)
    assert log.models == ("conv", "code")
    counts = np.bincount(log.model_index)
    assert counts.tolist() == [19366, 8819]
    assert np.all(np.diff(log.t) >= 0) and log.t[0] == 0
    assert 3000 < log.duration_s < 3700
    code = read_azure_llm(SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")
    assert len(code) == 8819 and code.models == ("code",)


@needs_shared
def test_real_azure_functions() -> None:
    s = load_trace(SHARED / "azure_functions_2019_500fn_8h" / "invocations.csv")
    assert isinstance(s, RateSeries)
    assert s.rates.shape == (500, 480) and s.step_s == 60 and not np.isnan(s.rates).any()
    assert len(set(s.models)) == 500
    durations = s.meta["duration_ms"]
    memory = s.meta["memory_mb"]
    assert isinstance(durations, dict) and isinstance(memory, dict)
    assert len(durations) == 500 and len(memory) > 400
    assert s.meta["first_minute"] == 480


@needs_shared
def test_real_servegen() -> None:
    s = load_trace(SHARED / "servegen" / "m-small")
    assert isinstance(s, RateSeries)
    assert s.rates.shape == (43, 2016) and s.step_s == 600
    assert set(np.unique(s.meta["iat_dist"])) <= {"", "Gamma", "Weibull"}  # type: ignore[arg-type]


@needs_shared
def test_real_mooncake() -> None:
    log = load_trace(SHARED / "mooncake_format_sample" / "synthetic_trace.jsonl")
    assert isinstance(log, RequestLog) and len(log) == 3993 and log.models == ("synthetic_trace",)
    assert log.duration_s == pytest.approx(1022.025)


@needs_shared
def test_real_alibaba() -> None:
    folder = SHARED / "alibaba_gpu_v2023"
    nodes = load_trace(folder / "openb_node_list_gpu_node.csv")
    assert isinstance(nodes, NodeTable) and nodes.total_gpus == 6212
    all_nodes = load_trace(folder / "openb_node_list_all_node.csv")
    assert isinstance(all_nodes, NodeTable) and len(all_nodes) == 1523 and all_nodes.total_gpus == 6212
    pods = load_trace(folder / "openb_pod_list_default.csv")
    assert isinstance(pods, PodTable) and len(pods) == 8152
    assert pods.sharing_fraction == pytest.approx(0.44, abs=0.01)  # README: "44% share a GPU"
    for p in sorted(folder.glob("openb_pod_list_*.csv")):
        assert isinstance(load_trace(p), PodTable)


@needs_shared
def test_bundled_slices_match_sources(tmp_path: Path) -> None:
    """The shipped slices are exactly what `trace convert` makes of the shared sources."""
    bundled = bundled_traces()
    pairs = [
        ("azure-llm-2023", SHARED / "azure_llm_2023", write_requests),
        ("azure-functions-2019", SHARED / "azure_functions_2019_500fn_8h", write_rates),
        ("servegen-m-small", SHARED / "servegen" / "m-small", write_rates),
    ]
    for name, src, writer in pairs:
        shipped = Path(bundled[name])
        fresh = writer(load_trace(src), tmp_path / shipped.name)  # type: ignore[operator]
        assert fresh.read_bytes() == shipped.read_bytes(), name
