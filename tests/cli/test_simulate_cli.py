"""``slotwise simulate`` end to end through ``autoscaler.cli.main`` (small trace slices, so it stays fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.cli.main import main
from autoscaler.sim.harness import POLICY_ORDER

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REQUIRED = (
    "requests",
    "slo_attainment",
    "violating_requests",
    "slo_minutes_met",
    "requests_within_latency",
    "gpu_hours",
    "gpu_hours_vs_oracle",
    "lent_gpu_hours",
    "scale_events",
    "unplaced_replica_minutes",
    "fragmentation",
    "sim_wall_s",
    "per_model",
    "invalid_models",
)


def results(path: Path) -> list[dict]:
    res = json.loads(path.read_text())["results"]
    assert isinstance(res, list), "results is a list, for one policy or many"
    return res


def check_cards(cards: list[dict], policies: tuple[str, ...]) -> None:
    assert [c["policy"] for c in cards] == list(policies)
    requests = {c["requests"] for c in cards}
    assert len(requests) == 1 and requests.pop() > 0, "every policy serves the same trace"
    for c in cards:
        for key in REQUIRED:
            assert key in c, (c["policy"], key)
        for key in ("slo_attainment", "slo_minutes_met", "requests_within_latency", "fragmentation"):
            assert 0.0 <= c[key] <= 1.0, (c["policy"], key, c[key])
        assert c["gpu_hours"] > 0 and c["gpu_hours_vs_oracle"] > 0
        assert c["per_model"], "per-model results"
        for name, pm in c["per_model"].items():
            assert "latency_at_slo_percentile_s" in pm, name
            assert pm["latency_at_slo_percentile_s"] is None or pm["latency_at_slo_percentile_s"] > 0
    by = {c["policy"]: c for c in cards}
    if "oracle" in by:
        assert by["oracle"]["gpu_hours_vs_oracle"] == pytest.approx(1.0)


def write_log(path: Path, rows: list[str], header: str = "t,model") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_all_policies_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_png = tmp_path / "o.json", tmp_path / "o.png"
    rc = main(
        [
            "simulate",
            "--trace",
            "azure-llm-2023",
            "--hours",
            "0.25",
            "--policy",
            "all",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert rc == 0
    check_cards(results(out_json), POLICY_ORDER)
    doc = json.loads(out_json.read_text())
    assert doc["trace"] == "azure-llm-2023" and doc["mode"] == "fluid" and doc["cluster"]
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    assert out_png.stat().st_size > 1000
    printed = capsys.readouterr().out
    for name in POLICY_ORDER:
        assert name in printed
    assert "slo_attainment" in printed and "SLO attainment: requests in SLO-meeting model-minutes" in printed


def test_out_dir_writes_both(tmp_path: Path) -> None:
    out = tmp_path / "report" / "nested"
    rc = main(
        ["simulate", "--trace", "azure-llm-2023", "--hours", "0.1", "--policy", "slotwise,static", "--out", str(out)]
    )
    assert rc == 0
    check_cards(results(out / "scorecard.json"), ("slotwise", "static"))
    assert (out / "simulation.png").read_bytes()[:8] == PNG_MAGIC


def test_single_policy_result_is_a_list_of_one_card(tmp_path: Path) -> None:
    out_json = tmp_path / "o.json"
    assert main(["simulate", "--hours", "0.1", "--policy", "hpa", "--json", str(out_json)]) == 0
    doc = json.loads(out_json.read_text())
    assert isinstance(doc["results"], list) and [c["policy"] for c in doc["results"]] == ["hpa"]


def test_des_mode(tmp_path: Path) -> None:
    out_json = tmp_path / "o.json"
    rc = main(
        [
            "simulate",
            "--trace",
            "azure-llm-2023",
            "--hours",
            "0.1",
            "--policy",
            "slotwise,oracle",
            "--mode",
            "des",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    cards = results(out_json)
    check_cards(cards, ("slotwise", "oracle"))
    assert all(c["mode"] == "des" for c in cards)
    # DES counts whole requests.
    assert float(cards[0]["requests"]).is_integer()


def test_fluid_and_des_count_the_same_requests(tmp_path: Path) -> None:
    got = {}
    for mode in ("fluid", "des"):
        out_json = tmp_path / f"{mode}.json"
        assert main(["simulate", "--hours", "0.1", "--policy", "static", "--mode", mode, "--json", str(out_json)]) == 0
        got[mode] = results(out_json)[0]["requests"]
    assert got["fluid"] == got["des"]


def test_rate_series_trace(tmp_path: Path) -> None:
    out_json = tmp_path / "o.json"
    rc = main(
        [
            "simulate",
            "--trace",
            "azure-functions-2019",
            "--hours",
            "0.25",
            "--policy",
            "kpa,static",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    check_cards(results(out_json), ("kpa", "static"))


def test_own_request_log_with_cluster_and_models(tmp_path: Path) -> None:
    rows = [f"{0.25 * k:.2f},{'a' if k % 3 else 'b'}" for k in range(2400)]
    trace = write_log(tmp_path / "req.csv", rows)
    models = tmp_path / "models.yaml"
    models.write_text(
        "defaults:\n  slo-latency-ms: 800\n  service-time-ms: 100\nmodels:\n"
        "  a:\n    gpu-memory-gib: 20\n    gpu-compute-share: 0.25\n"
    )
    out_json = tmp_path / "o.json"
    rc = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--models",
            str(models),
            "--cluster",
            "4xH100-80GB:mig,2xL4",
            "--policy",
            "static,oracle",
            "--json",
            str(out_json),
        ]
    )
    assert rc == 0
    doc = json.loads(out_json.read_text())
    assert sum(n["gpu_count"] for n in doc["cluster"]) == 6
    cards = results(out_json)
    # requests arrive every 0.25 s; the scorecard starts after the burn-in (warmup + longest cold start)
    burn_in = cards[0]["burn_in_s"]
    assert burn_in > 0 and cards[0]["requests"] == sum(1 for k in range(2400) if 0.25 * k >= burn_in)
    assert cards[0]["gpus_total"] == 6
    assert set(cards[0]["per_model"]) == {"a", "b"}


def test_unknown_policy_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--hours", "0.05", "--policy", "slotwise,hpaa"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "hpaa" in err and "unknown policy" in err and "kpa" in err


@pytest.mark.parametrize(
    ("rows", "header", "line", "field"),
    [
        (["0,a", "1.5,a", "abc,b"], "t,model", 4, "t"),
        (["0,a", "5,a", "2,a"], "t,model", 4, "t"),
        (["0,a,10,5", "1,a,x,5"], "t,model,input_tokens,output_tokens", 3, "input_tokens"),
    ],
)
def test_malformed_trace_exits_2_naming_file_line_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: list[str], header: str, line: int, field: str
) -> None:
    trace = write_log(tmp_path / "bad.csv", rows, header)
    rc = main(["simulate", "--trace", str(trace), "--policy", "static"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"bad.csv:{line}" in err
    assert f"'{field}'" in err


def test_missing_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--trace", str(tmp_path / "nope.csv"), "--policy", "static"])
    assert rc == 2
    assert "nope.csv" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ("models: {conv: {slo-latency-ms: [\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        ("models:\n  nosuchmodel:\n    slo-latency-ms: 100\n", "nosuchmodel"),
    ],
)
def test_bad_models_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expect: str
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(content)
    rc = main(["simulate", "--hours", "0.05", "--policy", "static", "--models", str(models)])
    assert rc == 2
    err = capsys.readouterr().err
    assert expect in err and "models.yaml" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("models:\n  conv: 5\n", id="model-entry-not-a-mapping"),
        pytest.param("defaults: [1, 2]\n", id="defaults-not-a-mapping"),
    ],
)
def test_models_file_with_wrongly_shaped_entries_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(content)
    rc = main(["simulate", "--hours", "0.05", "--policy", "static", "--models", str(models)])
    assert rc == 2
    assert "models.yaml" in capsys.readouterr().err


def test_missing_models_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--hours", "0.05", "--policy", "static", "--models", str(tmp_path / "none.yaml")])
    assert rc == 2
    assert "none.yaml" in capsys.readouterr().err


def test_invalid_model_values_leave_that_model_unmanaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  conv:\n    slo-percentile: 100\n")
    out_json = tmp_path / "o.json"
    rc = main(["simulate", "--hours", "0.1", "--policy", "slotwise", "--models", str(models), "--json", str(out_json)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "conv" in err and "slo-percentile" in err and "unmanaged" in err
    (card,) = results(out_json)
    assert set(card["invalid_models"]) == {"conv"}
    assert card["per_model"]["conv"]["mean_replicas"] == 0
    others = [m for m in card["per_model"] if m != "conv"]
    assert others and all(card["per_model"][m]["mean_replicas"] > 0 for m in others)


@pytest.mark.parametrize(
    ("cluster", "expect"),
    [("8xFOO", "FOO"), ("3xT4:mig", "does not support MIG"), ("", "")],
)
def test_bad_cluster_spec_is_a_clear_error(capsys: pytest.CaptureFixture[str], cluster: str, expect: str) -> None:
    if not cluster:
        cluster = "8xH100-80GB:gpn=0"
    rc = main(["simulate", "--hours", "0.05", "--policy", "static", "--cluster", cluster])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("slotwise: ") and expect in err


def test_cluster_yaml_file(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("- {kind: H100-80GB, nodes: 1, gpus_per_node: 8, mig: true}\n- {kind: L4, gpus: 4}\n")
    out_json = tmp_path / "o.json"
    assert (
        main(["simulate", "--hours", "0.05", "--policy", "static", "--cluster", str(cluster), "--json", str(out_json)])
        == 0
    )
    assert results(out_json)[0]["gpus_total"] == 12


def test_unparseable_cluster_yaml_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("- {kind: H100-80GB, nodes: [\n")
    rc = main(["simulate", "--hours", "0.05", "--policy", "static", "--cluster", str(cluster)])
    assert rc == 2
    assert "cluster.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("tick", ["0", "-5"])
def test_non_positive_tick_is_a_clear_error(capsys: pytest.CaptureFixture[str], tick: str) -> None:
    rc = main(["simulate", "--hours", "0.05", "--policy", "static", "--tick", tick])
    assert rc == 2
    assert "tick" in capsys.readouterr().err


# ------------------------------------------------------------------ --scenario with --arbitration (issue 9)

MODES = ("slo", "priority", "partition")
LABELS = [f"slotwise/{m}" for m in MODES]


@pytest.fixture(scope="module")
def arbitration_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """failure-day's first 40 minutes (the node loss at 00:29 included), once per arbitration mode."""
    import contextlib
    import io

    d = tmp_path_factory.mktemp("arb")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["simulate", "--scenario", "failure-day", "--hours", "0.65", "--arbitration", ",".join(MODES),
                   "--json", str(d / "card.json"), "--out", str(d / "report")])
    assert rc == 0
    return d / "card.json", d / "report", out.getvalue()


def test_arbitration_modes_run_side_by_side_with_per_team_rows(arbitration_run: tuple[Path, Path, str]) -> None:
    card_json, _, printed = arbitration_run
    doc = json.loads(card_json.read_text())
    assert [r["label"] for r in doc["runs"]] == LABELS
    assert [(r["policy"], r["arbitration"]) for r in doc["runs"]] == [("slotwise", m) for m in MODES]
    assert [c["policy"] for c in doc["results"]] == LABELS
    assert [c["arbitration"] for c in doc["results"]] == list(MODES)
    teams = {t["name"] for t in doc["teams"]}
    for label, card in zip(LABELS, doc["results"], strict=True):
        rows = doc["per_team"][label]
        assert {r["team"] for r in rows} == teams == {"search", "assist", "platform"}
        for r in rows:
            assert 0.0 <= r["slo_attainment"] <= 1.0 and 0.0 <= r["success_rate"] <= 1.0
            assert r["gpu_hours_busy"] <= r["gpu_hours_allocated"] + 1e-9
        overall = doc["overall"][label]
        assert overall["unreasoned"] == 0
        assert sum(r["gpu_hours_allocated"] for r in rows) == pytest.approx(overall["gpu_hours_allocated"])
        assert sum(r["cost_usd"] for r in rows) == pytest.approx(card["serving_cost_usd"])
        assert overall["cost_usd"] == card["cost_usd"]
        assert sum(r["requests"] for r in rows) == pytest.approx(card["requests"])
        assert {r["model"] for r in doc["recovery"][label]} == {"chat", "code"}
    for text in (*LABELS, "per team: quota, requests, SLO", "preemptions by reason and shortfall by cause",
                 "recovery of the highest-priority models", "node_lost"):
        assert text in printed, text


def test_out_writes_json_html_png_with_the_same_numbers(arbitration_run: tuple[Path, Path, str]) -> None:
    import base64
    import html
    import re

    from autoscaler.report.scenario import tables

    card_json, report, _ = arbitration_run
    doc = json.loads((report / "scorecard.json").read_text())
    other = json.loads(card_json.read_text())
    assert doc == other  # --json and --out: one document
    png = (report / "report.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 5000
    page = (report / "report.html").read_text()
    embedded = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert embedded and base64.b64decode(embedded.group(1)) == png
    flat = page.replace("<td class=n>", "<td>")
    for t in tables(json.loads((report / "scorecard.json").read_text())):
        assert html.escape(t.title) in page
        for r in t.rows:
            assert "".join(f"<td>{html.escape(v)}</td>" for v in r) in flat, (t.title, r)
    for label in LABELS:
        for r in doc["per_team"][label]:
            assert f"${r['cost_usd']:,.2f}" in page
    # `slotwise report --sim` reads the scenario's JSON too (one section per run)
    assert main(["report", "--sim", str(card_json), "--out", str(report / "cost")]) == 0
    sections = json.loads((report / "cost" / "report.json").read_text())["sections"]
    assert [s["policy"] for s in sections] == LABELS
    assert all("scenario failure-day" in s["title"] for s in sections)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "failure-day", "--arbitration", "slo,fair"], "--arbitration: unknown mode 'fair'"),
        (["--scenario", "failure-day", "--arbitration", ","], "--arbitration: unknown mode"),
        (["--scenario", "failure-day", "--arbitration", "slo,slo"], "mode slo given twice"),
        (["--arbitration", "slo"], "--arbitration needs --scenario"),
    ],
)
def test_bad_arbitration_flag_exits_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--hours", "0.05", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    if "unknown mode" in message:
        assert "slo, priority, partition" in err


def test_declared_models_tell_the_controller_one_spec_while_the_engines_serve_another(tmp_path: Path) -> None:
    """``--declared-models`` (issue 28): the annotations the controller reads, the engines serving ``--models``. A
    decode declared 20 % fast hides the ITL's batch cap: sized on the declaration alone a run holds what engines that
    really decode that fast need (``true``, 3.75 GPU-h) and misses most minutes (benchmarks.md section 17: 15 % in
    SLO-meeting minutes); learned from the engines' ITL, it holds the cap's count and meets the SLO."""
    truth = tmp_path / "truth.yaml"
    truth.write_text("defaults:\n  slo-itl-ms: 25\n  decode-batch-slowdown: 0.05\n")
    told = tmp_path / "told.yaml"
    told.write_text("defaults:\n  slo-itl-ms: 25\n  decode-batch-slowdown: 0.05\n  decode-ms-per-token: 16\n")
    runs = {}
    for name, args in (("true", ["--models", str(told)]), ("told", ["--models", str(truth), "--declared-models",
                                                                       str(told)])):
        out = tmp_path / f"{name}.json"
        assert main(["simulate", "--history-hours", "0.25", "--hours", "0.4", "--policy", "slotwise", *args,
                     "--json", str(out)]) == 0
        (runs[name],) = results(out)
    # (``true``: engines that really decode at 16 ms: the declaration is right and needs fewer replicas)
    assert runs["told"]["gpu_hours"] > 1.5 * runs["true"]["gpu_hours"]
    assert runs["told"]["slo_attainment"] >= 0.95
    assert runs["told"]["invalid_models"] == {}


def test_declared_models_with_a_bad_value_leave_that_model_unmanaged(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    told = tmp_path / "told.yaml"
    told.write_text("models:\n  conv:\n    slo-percentile: 100\n")
    out = tmp_path / "o.json"
    assert main(["simulate", "--hours", "0.1", "--policy", "slotwise", "--declared-models", str(told),
                 "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "conv" in err and "declared" in err and "slo-percentile" in err
    (card,) = results(out)
    assert set(card["invalid_models"]) == {"conv"}
