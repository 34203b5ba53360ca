"""The chart's alert rules (``charts/slotwise/rules/*.yaml``) with the real ``promtool``.

- every rule file passes ``promtool check rules`` and every unit-test file ``promtool test rules``;
- every alert is shown FIRING in some test (a non-empty ``exp_alerts`` naming it) and NOT firing in another
  (an empty ``exp_alerts`` for it at some eval time), and every rule file is loaded by some test file;
- the unit tests bite: a rule weakened on purpose (a threshold, a ``for``, a window) makes them fail;
- alert conventions: ``Slotwise`` CamelCase names, ``severity`` page or ticket, summary / description /
  runbook_url annotations, the runbook a ``docs/alerts.md`` anchor named after the alert (and, once that
  page exists, a heading there for each);
- every ``slotwise_*`` metric a rule reads is one :class:`~autoscaler.live.exporter.ControllerMetrics` exports
  (:data:`LENDING_METRICS` lists exceptions still to come: none now).

``promtool`` comes from Debian's ``prometheus`` package via ``tests/realparts/prometheus.py``
(``ensure_binaries``: installed when missing, the tests SKIP with the reason when impossible).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from autoscaler.live.exporter import ControllerMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "charts" / "slotwise" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))
TEST_FILES = sorted((RULES_DIR / "tests").glob("*.yaml"))
ALERTS_DOC = ROOT / "docs" / "alerts.md"

# Metrics the rules may read before the exporter exports them (none left: the lending issue exports the
# reclaim-duration histogram and the deadline gauge; keep the mechanism for the next metric that comes later).
LENDING_METRICS: frozenset[str] = frozenset()

ALERT_NAME = re.compile(r"Slotwise(?:[A-Z][A-Za-z0-9]*)+")
RECORD_NAME = re.compile(r"slotwise:[a-z0-9_]+:[a-z0-9_]+")
# a metric name in PromQL: not the tail of a longer name, nor part of a recording rule's name (those have ':')
METRIC_IN_EXPR = re.compile(r"(?<![A-Za-z0-9_:])slotwise_[a-z_]+(?![A-Za-z0-9_:])")


@pytest.fixture(scope="module")
def promtool() -> str:
    from realparts.prometheus import ensure_binaries  # after pytest loaded conftest paths (see other tests)

    return ensure_binaries()[1]


def _load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict), f"{path} is not a YAML mapping"
    return doc


def _rules(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    """(file, rule) for every rule with key ``kind`` (``alert`` or ``record``) in the rule files."""
    return [(p, r) for p in RULE_FILES for g in _load(p)["groups"] for r in g["rules"] if kind in r]


def _alert_names() -> list[str]:
    return [r["alert"] for _, r in _rules("alert")]


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


def test_there_are_rule_files_and_tests() -> None:
    assert RULE_FILES, f"no rule files under {RULES_DIR}"
    assert TEST_FILES, f"no promtool unit tests under {RULES_DIR / 'tests'}"
    names = _alert_names()
    assert len(names) == len(set(names)), f"duplicate alert names: {sorted(names)}"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(promtool: str, path: Path) -> None:
    done = _run([promtool, "check", "rules", str(path)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(promtool: str, path: Path) -> None:
    # run from the test file's folder too: rule_files paths resolve against it either way
    done = _run([promtool, "test", "rules", path.name], cwd=path.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_rule_file_is_loaded_by_a_unit_test() -> None:
    loaded = {
        (path.parent / rf).resolve() for path in TEST_FILES for rf in _load(path).get("rule_files", [])
    }
    assert {p.resolve() for p in RULE_FILES} <= loaded, "rule files without a promtool unit test"


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for case in _load(path)["tests"]:
            for check in case.get("alert_rule_test", []) or []:
                name = check["alertname"]
                if check.get("exp_alerts"):
                    firing.add(name)
                else:
                    quiet.add(name)
    alerts = set(_alert_names())
    assert alerts - firing == set(), "alerts never shown firing"
    assert alerts - quiet == set(), "alerts never shown NOT firing"
    assert (firing | quiet) - alerts == set(), "tests name alerts that no rule file defines"


def test_alert_and_recording_rule_conventions() -> None:
    for path, rule in _rules("alert"):
        name = rule["alert"]
        where = f"{path.name}: {name}"
        assert ALERT_NAME.fullmatch(name), f"{where}: not a CamelCase name with the Slotwise prefix"
        assert rule.get("labels", {}).get("severity") in {"page", "ticket"}, where
        notes = rule.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(notes), where
        assert notes["runbook_url"] == f"docs/alerts.md#{name.lower()}", where
        assert "{{" not in rule["expr"], f"{where}: templating in an expr"
    for path, rule in _rules("record"):
        assert RECORD_NAME.fullmatch(rule["record"]), f"{path.name}: {rule['record']} (level:metric:operations)"


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_runbook_anchors_exist_in_the_alerts_page() -> None:
    assert ALERTS_DOC.exists(), f"{ALERTS_DOC.relative_to(ROOT)} is missing: the runbook anchors cannot be checked"
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", ALERTS_DOC.read_text(), flags=re.MULTILINE)
    anchors = {_github_anchor(h.strip("`")) for h in headings}
    missing = sorted(name for name in _alert_names() if name.lower() not in anchors)
    assert not missing, f"docs/alerts.md has no heading for {missing}"


def _exported_names() -> set[str]:
    """Every sample name ControllerMetrics can expose (counters' _total, histograms' _bucket/_count/_sum)."""
    names: set[str] = set()
    family: Metric
    for family in ControllerMetrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum")}
        else:
            names.add(family.name)
    return names


def test_rules_read_only_metrics_the_exporter_exports() -> None:
    exported = _exported_names()
    used: dict[str, set[str]] = {}
    for _path, rule in _rules("alert") + _rules("record"):
        for metric in METRIC_IN_EXPR.findall(rule["expr"]):
            used.setdefault(metric, set()).add(rule.get("alert") or rule.get("record"))
    assert "slotwise_requests_total" in used and "slotwise_is_leader" in used  # the regex finds names at all
    unknown = {m: sorted(rules) for m, rules in used.items() if m not in exported and m not in LENDING_METRICS}
    assert not unknown, f"rules read metrics the exporter does not export: {unknown}"
    # the exception list stays honest: every entry is read by a rule (and is dropped once exported for real)
    assert set(LENDING_METRICS) <= set(used), f"unused lending metrics listed: {LENDING_METRICS - set(used)}"


# The unit tests must catch a rule made wrong: each mutation (file, text, replacement) weakens one rule,
# and `promtool test rules` must then fail.
MUTATIONS = [
    # the stuck-reclaim alert: only the leader's gauge, and strictly past the deadline
    ("capacity.yaml", "(slotwise_reclaim_in_flight_age_seconds and on (job, instance) (slotwise_is_leader == 1))",
     "(slotwise_reclaim_in_flight_age_seconds)"),
    ("capacity.yaml", "> on () max(slotwise_reclaim_deadline_seconds)",
     ">= on () max(slotwise_reclaim_deadline_seconds)"),
    ("slo.yaml", "rate1h > on (model) (14.4", "rate1h > on (model) (13"),  # 1h at 14.17 % would page
    ("slo.yaml", "slotwise:slo_error_ratio:rate5m > on (model) (14.4",  # the short window dropped: the page
     "slotwise:slo_error_ratio:rate1h > on (model) (14.4"),  # would ring after the errors stopped
    ("slo.yaml", "slotwise:slo_error_ratio:rate30m > on (model) (6",
     "slotwise:slo_error_ratio:rate6h > on (model) (6"),
    # the objective of any replica (a former leader's frozen p99.9): the chat model would page too early
    ("slo.yaml", "(slotwise_slo_objective_ratio and on (job, instance) (slotwise_is_leader == 1))",
     "(slotwise_slo_objective_ratio)"),
    ("slo.yaml", "            or\n            max by (model) (slotwise_slo_objective_ratio)\n", ""),  # no fallback
    ("capacity.yaml", "for: 10m\n        labels:\n          severity: ticket\n        annotations:\n"
     "          summary: \"{{ $value }} replica(s)", "for: 3m\n        labels:\n          severity: ticket\n"
     "        annotations:\n          summary: \"{{ $value }} replica(s)"),
    ("capacity.yaml", ") > 0.25", ") > 0.1"),
    # a former leader's frozen gauges read as the cluster's state
    ("capacity.yaml", "(slotwise_shortfall_replicas and on (job, instance) (slotwise_is_leader == 1))",
     "(slotwise_shortfall_replicas)"),
    ("capacity.yaml", "(slotwise_metrics_stale and on (job, instance) (slotwise_is_leader == 1))",
     "(slotwise_metrics_stale)"),
    ("capacity.yaml", "(slotwise_observed_requests_per_second and on (job, instance) (slotwise_is_leader == 1))",
     "(slotwise_observed_requests_per_second)"),
    ("capacity.yaml", ") >= 3\n", ") >= 2\n"),
    ("capacity.yaml", "            > on ()\n", "            < on ()\n"),
    # a guarantee refused for 5 minutes would open a ticket; a 15-minute window keeps a short refusal alive
    ("capacity.yaml", "[5m])) > 0\n        for: 10m", "[5m])) > 0\n        for: 5m"),
    ("capacity.yaml", "(slotwise_guarantee_refusals_total[5m])", "(slotwise_guarantee_refusals_total[15m])"),
    ("capacity.yaml", "(slotwise_preemptions_total[10m])) > 20", "(slotwise_preemptions_total[10m])) > 10"),
    ("controller.yaml", "(slotwise_is_leader) == 0\n        for: 2m", "(slotwise_is_leader) == 0\n        for: 0m"),
    ("controller.yaml", "(slotwise_is_leader) > 1\n", "(slotwise_is_leader) >= 1\n"),
    ("controller.yaml", "[10m])) > 0.05", "[10m])) > 0.01"),
    ("controller.yaml", "unless on () max(up", "or on () max(up"),
]


@pytest.mark.parametrize(("file", "old", "new"), MUTATIONS, ids=[f"{m[0]}:{i}" for i, m in enumerate(MUTATIONS)])
def test_a_weakened_rule_fails_its_unit_test(promtool: str, tmp_path: Path, file: str, old: str, new: str) -> None:
    copy = tmp_path / "rules"
    shutil.copytree(RULES_DIR, copy)
    target = copy / file
    text = target.read_text()
    assert text.count(old) == 1, f"mutation anchor not found exactly once in {file}: {old!r}"
    target.write_text(text.replace(old, new))
    assert _run([promtool, "check", "rules", str(target)]).returncode == 0, "the mutation must stay valid"
    results = [_run([promtool, "test", "rules", p.name], cwd=copy / "tests") for p in TEST_FILES]
    assert any(r.returncode != 0 for r in results), f"no unit test noticed {file}: {old!r} -> {new!r}"
