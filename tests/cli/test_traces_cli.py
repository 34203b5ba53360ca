"""``slotwise trace info|convert|list``, driven through the subcommand's own register()."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from autoscaler.cli import trace as trace_cmd
from forecasting.traces import RateSeries, RequestLog, TraceFormatError, read_rates, read_requests

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="slotwise")
    sub = parser.add_subparsers(dest="command", required=True)
    trace_cmd.register(sub)
    args = parser.parse_args(["trace", *argv])
    return int(args.func(args))


@pytest.fixture
def requests_csv(tmp_path: Path) -> Path:
    p = tmp_path / "r.csv"
    p.write_text("t,model,input_tokens,output_tokens\n0,a,10,1\n1,b,20,2\n30,a,30,3\n61,a,40,4\n")
    return p


def test_info_request_log(requests_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["info", str(requests_csv)]) == 0
    out = capsys.readouterr().out
    assert "format: requests" in out and "kind: request log" in out
    assert "requests: 4" in out and "models: 2" in out
    assert "input tokens: mean 25" in out
    lines = out.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("per model"))) + 1 :]
    assert table[1].split()[:2] == ["a", "3"]  # busiest first


def test_info_rates_and_top(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "s.csv"
    p.write_text("t,model,rate\n0,x,1\n60,x,3\n0,y,0.5\n60,y,\n0,z,0\n60,z,0\n")
    assert run(["info", str(p), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "kind: rate series" in out and "step: 60 s x 2 steps" in out
    assert "missing points: 1" in out
    assert "busiest 1 of 3" in out
    assert "  x " in out and "  y " not in out


def test_info_bundled_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["info", "azure-functions-2019", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "models: 500" in out and "service-time priors" in out and "mean ms" in out


def test_info_cluster_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "pods.csv"
    p.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1,1,500\np1,1000,1,1,1000\np2,1,1,0,0\n"
    )
    assert run(["info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "kind: pods" in out and "GPU-sharing pods: 1 (50.0% of GPU pods)" in out


def test_convert_requests_and_bin(requests_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy.csv.gz"
    assert run(["convert", str(requests_csv), str(out)]) == 0
    back = read_requests(out)
    assert isinstance(back, RequestLog) and len(back) == 4 and back.models == ("a", "b")
    rates = tmp_path / "rates.csv"
    assert run(["convert", "--to", "rates", "--step", "30", str(requests_csv), str(rates)]) == 0
    s = read_rates(rates)
    assert s.step_s == 30 and s.n_steps == 3
    np.testing.assert_allclose(s.rates * 30, [[1, 1, 1], [1, 0, 0]])
    assert "mean_input_tokens" in s.meta  # per-bin means ride along as extra columns
    coarse = tmp_path / "coarse.csv"
    assert run(["convert", "--step", "90", str(rates), str(coarse)]) == 0
    coarse_back = read_rates(coarse)
    # one step: the writer appends an empty step so the step length survives
    assert coarse_back.step_s == 90 and coarse_back.rates.shape == (2, 2)
    np.testing.assert_allclose(coarse_back.rates[:, 0] * 90, [3, 1])
    assert np.isnan(coarse_back.rates[:, 1]).all()


def test_convert_usage_errors(requests_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["convert", "--to", "rates", str(requests_csv), str(tmp_path / "o.csv")]) == 2
    assert "--step" in capsys.readouterr().err
    rates = tmp_path / "s.csv"
    rates.write_text("t,model,rate\n0,m,1\n60,m,2\n")
    assert run(["convert", "--to", "requests", str(rates), str(tmp_path / "o.csv")]) == 2
    assert run(["convert", "--step", "45", str(rates), str(tmp_path / "o.csv")]) == 2
    assert run(["convert", "--to", "rates", "--step", "-1", str(requests_csv), str(tmp_path / "o.csv")]) == 2
    assert not (tmp_path / "o.csv").exists()


def test_convert_cluster_table_and_bad_input(tmp_path: Path) -> None:
    nodes = tmp_path / "n.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\n")
    with pytest.raises(TraceFormatError, match="cluster table"):
        run(["convert", str(nodes), str(tmp_path / "o.csv")])
    bad = tmp_path / "bad.csv"
    bad.write_text("t,model\n0,m\noops,m\n")
    with pytest.raises(TraceFormatError) as info:
        run(["info", str(bad)])
    assert info.value.line == 3 and info.value.field == "t"
    with pytest.raises(FileNotFoundError):
        run(["info", str(tmp_path / "missing.csv")])


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["list"]) == 0
    out = capsys.readouterr().out
    assert "azure-functions-2019" in out and "servegen-m-small" in out


def test_through_slotwise_main(
    requests_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autoscaler.cli.main import main

    assert main(["trace", "info", str(requests_csv)]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("t,model\n0,m\n-1,m\n")
    assert main(["trace", "info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: field 't'" in err


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared trace data not available")
def test_convert_real_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "moon.csv"
    assert run(["convert", str(SHARED / "mooncake_format_sample" / "synthetic_trace.jsonl"), str(out)]) == 0
    assert len(read_requests(out)) == 3993
    out = tmp_path / "sg.csv.gz"
    assert run(["convert", "--from", "servegen", str(SHARED / "servegen" / "m-small"), str(out)]) == 0
    s = read_rates(out)
    assert isinstance(s, RateSeries) and s.rates.shape == (43, 2016) and "cv" in s.meta
    assert run(["info", str(SHARED / "alibaba_gpu_v2023" / "openb_pod_list_default.csv")]) == 0
    assert "43.6% of GPU pods" in capsys.readouterr().out
