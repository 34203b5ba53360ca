"""The Grafana dashboard shipped with the chart (``charts/slotwise/dashboards/slotwise.json``).

Three kinds of check:

- **Structure** Grafana needs to import it: title, uid, schemaVersion, a ``templating`` list with the
  ``datasource`` variable and the ``namespace`` / ``team`` / ``model`` variables, panels with unique ids and a
  ``gridPos`` inside the 24-column grid that overlaps no other panel, targets with ``expr`` and a ``refId``
  unique in the panel, and no hard-coded datasource UID (everything reads ``${datasource}``).
- **Every metric a query names is exported**: a small PromQL tokenizer (:func:`metric_names`) takes the metric
  names out of every expression and of every variable query; each must be a sample name the real
  :class:`~autoscaler.live.exporter.ControllerMetrics` or :class:`~autoscaler.live.cost_metrics.CostMetrics`
  registers, or a recording rule of ``charts/slotwise/rules/``. A deliberately broken expression shows the check
  can fail. Every selector of a metric that carries a ``model`` / ``team`` / ``namespace`` label filters by the
  matching dashboard variable, and every variable is used.
- **Every query runs and shows the right numbers** in a real Prometheus: two hours of history recorded by the
  real exporter and cost counters (a tick every 30 s over a small fleet: two namespaces, two teams, a whole
  L4, two MIG 3g slices of an A100, lent training, a shortfall, a stale model, errors) are backfilled into a
  real Prometheus; every target, with Grafana's variables expanded as Grafana would, must evaluate without
  error, every panel must show data, the variable queries must list the fleet's namespaces, teams and models,
  selecting one model must leave only its series, and the SLO attainment, burn rate, GPU-hours, cost, idle
  and price panels must show the values the history implies.
"""

from __future__ import annotations

import copy
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry
from realparts.prometheus import PrometheusServer, running_prometheus

from autoscaler.api.plan import (
    Plan,
    PreemptionReason,
    Reason,
    RemoveReplica,
    Shortfall,
    ShortfallCause,
    UpdateStatus,
)
from autoscaler.api.snapshot import (
    ClusterSnapshot,
    MetricsWindow,
    ModelMetrics,
    ModelObservation,
    Replica,
    TrainingWorkload,
)
from autoscaler.api.spec import ModelSpec
from autoscaler.decision.arbitration import TeamQuota
from autoscaler.live.cost_metrics import CostMetrics
from autoscaler.live.exporter import ControllerMetrics
from sharing.catalog import load_catalog
from sharing.slots import Inventory, NodeSpec, Slot

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "slotwise" / "dashboards" / "slotwise.json"
RULES_DIR = ROOT / "charts" / "slotwise" / "rules"
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
FILTER_VARS = ("model", "team", "namespace")  # a metric's label -> the variable every selector must filter by
PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "table", "state-timeline"}
UNITS = {"reqps", "s", "percentunit", "currencyUSD", "short", "none"}

# -- a small PromQL tokenizer ---------------------------------------------------------------------------------
def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FUNCTIONS = _words("""
abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp clamp_max
clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg delta deriv exp floor
histogram_count histogram_fraction histogram_quantile histogram_sum holt_winters hour idelta increase irate
label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month
pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_desc
sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector year
""")
AGGREGATIONS = _words("sum min max avg group stddev stdvar count count_values bottomk topk quantile")
KEYWORDS = _words("by without on ignoring group_left group_right bool and or unless offset atan2 inf nan")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\[\]]*\]")  # [5m], [$__range], subqueries [1h:1m]
_MATCHERS = re.compile(r"\{[^{}]*\}")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")
# durations (offset 5m) and numbers go first, so that "5m" or "1e3" never yields an identifier "m" or "e3"
_TOKEN = re.compile(
    r"(?:\d+(?:ms|[smhdwy]))+|0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[a-zA-Z_:][a-zA-Z0-9_:]*"
)
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.*?)\s*,\s*(?P<label>\w+)\s*\)\s*$", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers left once strings, ranges, label matchers
    ``{..}`` and label lists (``by (..)``, ``on (..)``, ...) are gone, minus functions and keywords."""
    text = _STRING.sub(" ", expr)  # first: strings may hold braces, brackets or "$model"
    text = _RANGE.sub(" ", text)
    text = _GRAFANA_VAR.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for token in _TOKEN.findall(text):
        if not _IDENT.fullmatch(token):
            continue  # a number or a duration
        if token in FUNCTIONS or token in AGGREGATIONS or token.lower() in KEYWORDS:
            continue
        names.add(token)
    return names


def selectors(expr: str, metric: str) -> list[dict[str, tuple[str, str]]]:
    """Each occurrence of ``metric`` in ``expr`` as its matchers: ``{label: (operator, value)}``."""
    out = []
    pattern = re.compile(rf"(?<![\w:]){re.escape(metric)}(?![\w:])\s*(?:\{{(?P<m>[^{{}}]*)\}})?")
    for match in pattern.finditer(expr):
        matchers = {}
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', match.group("m") or ""):
            matchers[label] = (op, value)
        out.append(matchers)
    return out


# -- the dashboard ----------------------------------------------------------------------------------------------
def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    with path.open() as f:
        return json.load(f)


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels a collapsed row holds."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p["type"] != "row"]


def targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            yield panel, target


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def variable_query(var: dict[str, Any]) -> str:
    q = var["query"]
    return q["query"] if isinstance(q, dict) else q


def rule_names(rules_dir: Path = RULES_DIR) -> set[str]:
    """``record:`` names of the plain Prometheus rule files (promtool test files have no ``groups``)."""
    names: set[str] = set()
    for path in sorted(rules_dir.glob("**/*.y*ml")) if rules_dir.is_dir() else ():
        doc = yaml.safe_load(path.read_text()) or {}
        if not isinstance(doc, dict):
            continue
        for group in doc.get("groups") or ():
            names.update(r["record"] for r in group.get("rules") or () if "record" in r)
    return names


def exported(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Sample name -> label names of every metric the registry exposes (the names PromQL sees: a counter
    ``x`` is ``x_total``, a histogram ``x_bucket`` / ``x_sum`` / ``x_count``)."""
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
        for suffix in suffixes:
            out.setdefault(family.name + suffix, set())
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out.setdefault(sample.name, set()).update(k for k in sample.labels if k != "le")
    return out


def unknown_metrics(dashboard: dict[str, Any], known: set[str]) -> dict[str, set[str]]:
    """Panel title (or ``variable NAME``) -> metric names its queries read that ``known`` lacks; also a
    query that names no metric at all (``{__name__=...}`` tricks or an empty expr) is reported."""
    bad: dict[str, set[str]] = {}
    for panel, target in targets(dashboard):
        names = metric_names(target["expr"])
        missing = (names - known) or ({"<no metric named>"} if not names else set())
        if missing:
            bad.setdefault(panel["title"], set()).update(missing)
    for name, var in variables(dashboard).items():
        if var["type"] != "query":
            continue
        m = _LABEL_VALUES.match(variable_query(var))
        selector = m.group("selector") if m else "<not label_values(selector, label)>"
        missing = metric_names(selector) - known or (set() if m else {selector})
        if missing:
            bad.setdefault(f"variable {name}", set()).update(missing)
    return bad


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


# -- structure ----------------------------------------------------------------------------------------------------
def test_dashboard_has_the_structure_grafana_imports(dashboard) -> None:
    assert dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"]), "a Grafana uid: at most 40 of [A-Za-z0-9_-]"
    assert dashboard["schemaVersion"] >= 36  # the JSON model of Grafana 9+ (datasource refs as objects)
    assert isinstance(dashboard["templating"]["list"], list)
    panels = list(all_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), "panel ids must be unique ints"
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        assert p["type"] in PANEL_TYPES, p["type"]
        gp = p["gridPos"]
        assert all(isinstance(gp[k], int) for k in "hwxy"), p["title"]
        assert gp["w"] > 0 and gp["h"] > 0 and gp["x"] >= 0 and gp["x"] + gp["w"] <= 24, p["title"]
        for x in range(gp["x"], gp["x"] + gp["w"]):  # no two panels share a grid cell
            for y in range(gp["y"], gp["y"] + gp["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    rows = [p for p in panels if p["type"] == "row"]
    assert [r["title"] for r in rows] == ["Models", "Fleet", "Cost", "Teams"]
    titles = [p["title"] for p in query_panels(dashboard)]
    assert len(titles) == len(set(titles)), "panel titles must be unique (the value tests find panels by title)"
    for p in query_panels(dashboard):
        assert p["datasource"] == DS_REF, p["title"]
        assert p.get("description"), f"{p['title']!r}: say what the panel shows"
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == DS_REF, p["title"]
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert unit is None or unit in UNITS, (p["title"], unit)


def test_no_hard_coded_datasource_uid(dashboard) -> None:
    """Every datasource reference is the ``datasource`` variable: the dashboard works with any Prometheus."""
    seen = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "datasource" and isinstance(v, dict):
                    assert v == DS_REF, f"{path}.datasource = {v}"
                    seen.append(path)
                elif k == "uid" and path != "":
                    pytest.fail(f"{path}.uid = {v!r}: no UIDs besides the dashboard's own")
                else:
                    walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(dashboard, "")
    assert len(seen) > len(query_panels(dashboard))  # panels, their targets and the query variables


def test_templating_has_datasource_and_label_values_variables(dashboard) -> None:
    vs = variables(dashboard)
    assert vs["datasource"]["type"] == "datasource" and vs["datasource"]["query"] == "prometheus"
    for name in FILTER_VARS:
        v = vs[name]
        assert v["type"] == "query" and v["datasource"] == DS_REF
        m = _LABEL_VALUES.match(variable_query(v))
        assert m, f"{name}: {variable_query(v)!r} is not label_values(selector, label)"
        names = metric_names(m.group("selector"))
        assert names and all(n.startswith("slotwise_") for n in names), (name, names)
        # "All" must match every value (also a model no label_values listed yet), multi-select is a regex
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"


# -- metric names -------------------------------------------------------------------------------------------------
def test_tokenizer_finds_metrics_and_skips_functions_labels_and_numbers() -> None:
    expr = (
        'sum by (model, reason) (increase(slotwise_decisions_total{model=~"$model", reason!="x{y}"}[$__range]))'
        " / on (model) group_left (team) max without (instance) (foo:bar:ratio offset 5m) * 1e3 + 0.5"
        ' and histogram_quantile(0.9, sum by (le) (rate(slotwise_tick_duration_seconds_bucket[5m]))) > bool 2'
        " or vector(0) unless time() - 3600 > Inf"
    )
    assert metric_names(expr) == {"slotwise_decisions_total", "foo:bar:ratio", "slotwise_tick_duration_seconds_bucket"}
    m = _LABEL_VALUES.match('label_values(slotwise_desired_replicas{model=~"$namespace/.*"}, model)')
    assert m is not None and m.group("label") == "model"
    assert metric_names(m.group("selector")) == {"slotwise_desired_replicas"}
    assert selectors('max(a{model=~"$model"}) / a', "a") == [{"model": ("=~", "$model")}, {}]


def _known_names() -> tuple[set[str], dict[str, set[str]]]:
    """Names the dashboard may read, and their labels: the real exporter's and cost counters' registry
    (after one tick of the test fleet, so labelled series exist) plus the chart's recording rules."""
    fleet = Fleet()
    metrics = fleet.tick(fleet.start)
    labels = exported(metrics.registry)
    return set(labels) | rule_names(), labels


def test_every_query_names_a_metric_the_exporter_exposes(dashboard) -> None:
    known, _ = _known_names()
    bad = unknown_metrics(dashboard, known)
    assert not bad, f"queries name metrics nothing exports: {bad}"
    # the check reads every query: the dashboard uses the exporter's, the SLO counters and the cost counters
    used = {n for _, t in targets(dashboard) for n in metric_names(t["expr"])}
    assert {"slotwise_requests_total", "slotwise_gpu_cost_dollars_total", "slotwise_gpu_slots"} <= used


def test_a_query_with_an_unknown_metric_is_caught(dashboard) -> None:
    known, _ = _known_names()
    broken = copy.deepcopy(dashboard)
    panel = next(p for p in query_panels(broken) if p["title"] == "Load vs forecast")
    panel["targets"][0]["expr"] = 'max by (model) (slotwise_observed_request_per_second{model=~"$model"})'  # typo
    panel["targets"].append({"refId": "Z", "expr": 'sum(rate({__name__="slotwise_x"}[5m]))'})
    variables(broken)["team"]["query"] = "label_values(slotwise_gpu_costs_total, team)"
    assert unknown_metrics(broken, known) == {
        "Load vs forecast": {"slotwise_observed_request_per_second", "<no metric named>"},
        "variable team": {"slotwise_gpu_costs_total"},
    }


def test_panels_filter_by_the_variables_and_every_variable_is_used(dashboard) -> None:
    """A selector of a metric with a ``model`` / ``team`` / ``namespace`` label filters by ``=~"$model"``
    (etc.): choosing a model, team or namespace narrows every panel it can. And no variable is dead."""
    _, labels = _known_names()
    unfiltered = []
    for panel, target in targets(dashboard):
        for metric in metric_names(target["expr"]):
            for matchers in selectors(target["expr"], metric):
                for var in FILTER_VARS:
                    if var in labels.get(metric, ()) and matchers.get(var) != ("=~", f"${var}"):
                        unfiltered.append((panel["title"], metric, var))
    assert not unfiltered, f"selectors not filtered by their variable: {unfiltered}"
    texts = [t["expr"] for _, t in targets(dashboard)] + [variable_query(v) for v in variables(dashboard).values()]
    for name in set(variables(dashboard)) - {"datasource"}:  # datasource: every panel's, checked above
        assert any(re.search(rf"\$(?:{name}\b|\{{{name}[}}:])", t) for t in texts), f"variable {name} is unused"
    # the per-model row reads every per-model gauge and the SLO counters
    model_row = {n for p, t in targets(dashboard) if p["gridPos"]["y"] < _row_y(dashboard, "Fleet")
                 for n in metric_names(t["expr"])}
    assert {
        "slotwise_observed_requests_per_second", "slotwise_forecast_requests_per_second",
        "slotwise_desired_replicas", "slotwise_current_replicas", "slotwise_predicted_latency_seconds",
        "slotwise_slo_latency_seconds", "slotwise_requests_late_total", "slotwise_slo_objective_ratio",
    } <= model_row


def _row_y(dashboard: dict[str, Any], title: str) -> int:
    return next(p["gridPos"]["y"] for p in all_panels(dashboard) if p["type"] == "row" and p["title"] == title)


# -- a real Prometheus over history the real exporter recorded --------------------------------------------------
TICK_S = 30.0
HISTORY_S = 2 * 3600.0
RANGE = "1h"  # the dashboard's time range in the evaluation: $__range
RANGE_S = 3600.0
INSTANCE = {"job": "slotwise", "instance": "10.0.0.7:8080"}  # what a scrape of the leader would attach
PRICES = {"L4-24GB": 0.8, "A100-80GB": 3.5}
A100 = load_catalog().get("A100-80GB")
L4 = load_catalog().get("L4-24GB")
LATE_SHARE = {"prod/chat": 0.1, "prod/embed": 0.0}  # research/llm: stale metrics, nothing counted
PERCENTILE = {"prod/chat": 95.0, "prod/embed": 99.0, "research/llm": 95.0}
TEAM = {"prod/chat": "search", "prod/embed": "search", "research/llm": "ml"}
QUOTAS = (TeamQuota("search", 2.0, 1.0), TeamQuota("ml", 1.0))  # search may hold 3 GPUs; ml has no limit
PREEMPT_EVERY = 20  # ticks: research/llm loses a replica to prod/chat every 10 minutes


class Fleet:
    """A small fleet and the controller's metrics over it, one tick at a time: ``prod/chat`` (team search) on
    a whole L4, ``prod/embed`` (search) and ``research/llm`` (ml) on MIG 3g slices of one A100 of a two-A100
    node, training lent one GPU there; chat is one replica short (unplaceable, within search's guarantee: a
    guarantee refusal every tick) and 10% of its requests are late, llm's metrics are stale and one of its
    replicas is preempted for chat every :data:`PREEMPT_EVERY` ticks."""

    def __init__(self, start: float = 1_700_000_010.0) -> None:
        self.start = start
        self.metrics = ControllerMetrics(teams=QUOTAS)
        self.cost = CostMetrics(self.metrics.registry, load_catalog(), PRICES)
        self.metrics.set_leader(True)
        inv = Inventory.from_nodes([NodeSpec("n1", "A100-80GB", 2, mig_enabled=True), NodeSpec("n2", "L4-24GB", 1)])
        self.slots = {
            "prod/chat": Slot.whole("n2", 0, L4),
            "prod/embed": Slot.mig("n1", 0, A100, "3g", 0),
            "research/llm": Slot.mig("n1", 0, A100, "3g", 4),
        }
        for key, slot in self.slots.items():
            inv.allocate(slot, f"{key}-1", key)
        models = {}
        for key, slot in self.slots.items():
            ns, name = key.split("/")
            spec = ModelSpec(name, ns, slo_latency_ms=500, slo_percentile=PERCENTILE[key], team=TEAM[key])
            models[key] = ModelObservation(key, spec, 1, (Replica(f"{key}-1", slot, True, 0.0),))
        training = (TrainingWorkload("ml/train", "Job", gpus=1.0, nodes=("n1",), running=True),)
        self.snapshot = ClusterSnapshot(now=start, models=models, inventory=inv, training=training)
        self.ticks = 0

    def tick(self, now: float) -> ControllerMetrics:
        rate = {"prod/chat": 10.0 + 2.0 * math.sin(now / 900.0), "prod/embed": 5.0}
        window = MetricsWindow(now=now, step_s=TICK_S, models={
            key: ModelMetrics(rate=np.full(4, r), in_flight=np.full(4, 2.0),
                              within_rate=np.full(4, r * (1.0 - LATE_SHARE[key])))
            for key, r in rate.items()
        } | {"research/llm": ModelMetrics(rate=np.zeros(0), in_flight=np.zeros(0), stale=True)})
        plan = Plan(now=now, actions=[
            Shortfall("prod/chat", 1, "no free GPU slot fits the replica", ShortfallCause.UNPLACEABLE, "search", True),
            UpdateStatus("prod/chat", 2, 1, Reason.UNPLACEABLE, forecast_rps=12.5, predicted_latency_ms=420.0,
                         slo_latency_ms=500.0),
            UpdateStatus("prod/embed", 1, 1, Reason.STABLE, forecast_rps=5.5, predicted_latency_ms=120.0),
            UpdateStatus("research/llm", 1, 1, Reason.METRICS_STALE),
        ])
        if self.ticks % PREEMPT_EVERY == 0:
            plan.actions.append(RemoveReplica("research/llm", f"research/llm-p{self.ticks}", preempted_by="prod/chat",
                                              reason=PreemptionReason.PRIORITY, message="preempted for prod/chat"))
        snapshot = ClusterSnapshot(now=now, models=self.snapshot.models, inventory=self.snapshot.inventory,
                                   training=self.snapshot.training)
        self.metrics.record_tick(plan, snapshot, window, seconds=0.02 + 0.01 * (self.ticks % 5))
        self.cost.record(snapshot, 0.0 if self.ticks == 0 else TICK_S)  # charged: the time since the last
        if self.ticks % 10 == 0:
            self.metrics.record_actuation(SimpleNamespace(applied=["scale prod/chat: 1 -> 2"], skipped=[
                ("template prod/embed: resources {}", "unchanged")], errors=[]))
            self.metrics.error("metrics")
        self.ticks += 1
        return self.metrics


def _label_text(labels: dict[str, str]) -> str:
    """OpenMetrics label pairs: a value escapes backslash, double quote and newline."""
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))


def record_history(fleet: Fleet, end: float) -> str:
    """Tick the fleet every ``TICK_S`` up to ``end`` and return everything its registry exposed at each tick
    as OpenMetrics text with timestamps (each series' samples together, oldest first: what promtool's
    backfill wants)."""
    meta: dict[str, tuple[str, str]] = {}
    series: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]] = {}
    t = end - HISTORY_S
    while t <= end + 1e-6:
        for family in fleet.tick(t).registry.collect():
            meta[family.name] = (family.type, family.documentation)
            for s in family.samples:
                if s.name.endswith("_created"):  # creation times: no panel reads them
                    continue
                key = (s.name, tuple(sorted((s.labels | INSTANCE).items())))
                series.setdefault(family.name, {}).setdefault(key, []).append((t, s.value))
        t += TICK_S
    lines = []
    for name, samples in series.items():
        kind, doc = meta[name]
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for (sample, labels), points in samples.items():
            lines += [f"{sample}{{{_label_text(dict(labels))}}} {v!r} {int(ts)}" for ts, v in points]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@dataclass
class Evaluated:
    server: PrometheusServer
    end: float
    fleet: Fleet

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate at the end of the history; a vector or scalar as ``[{"metric": .., "value": float}]``."""
        body = self.api("query", {"query": expr, "time": f"{self.end:.0f}"})
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def label_values(self, selector: str, label: str) -> set[str]:
        params = {"match[]": selector, "start": f"{self.end - HISTORY_S:.0f}", "end": f"{self.end:.0f}"}
        return set(self.api(f"label/{label}/values", params)["data"])

    def api(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        url = f"{self.server.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422: a query Prometheus cannot parse or evaluate
            body = json.load(e)
        if body.get("status") != "success":
            raise AssertionError(f"{params}: {body.get('errorType')}: {body.get('error')}")
        return body


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluated]:
    end = 1_700_000_000.0 + 7 * 24 * 3600  # fixed: the numbers do not depend on today's date
    end = math.floor(end / TICK_S) * TICK_S
    fleet = Fleet(start=end - HISTORY_S)
    text = record_history(fleet, end)
    with running_prometheus(tmp_path_factory.mktemp("dashboard-prometheus"), openmetrics=text) as server:
        yield Evaluated(server, end, fleet)


def _regex(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus datasource formats it: regex-escaped, ``(a|b)``."""
    escaped = [re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def expand(expr: str, selected: dict[str, list[str] | None]) -> str:
    """Grafana's interpolation: the range and rate-interval macros, and each variable's value (None: All,
    i.e. its allValue ``.*``)."""
    values = {"__range": RANGE, "__rate_interval": "2m", "__interval": "30s"}
    for name in FILTER_VARS:
        chosen = selected.get(name)
        values[name] = ".*" if chosen is None else _regex(chosen)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)


ALL: dict[str, list[str] | None] = {}


def test_every_query_runs_in_prometheus_and_every_panel_shows_data(dashboard, prom) -> None:
    empty = []
    for panel in query_panels(dashboard):
        results = [prom.query(expand(t["expr"], ALL)) for t in panel["targets"]]  # raises on a query error
        if not any(results):
            empty.append(panel["title"])
    assert not empty, f"panels without data over the recorded history: {empty}"
    with pytest.raises(AssertionError, match="parse error"):  # and the evaluation can fail
        prom.query(expand('sum by (model (slotwise_desired_replicas{model=~"$model"})', ALL))


def test_variable_queries_list_the_fleets_namespaces_teams_and_models(dashboard, prom) -> None:
    vs = variables(dashboard)

    def listed(name: str, selected: dict[str, list[str] | None]) -> set[str]:
        m = _LABEL_VALUES.match(expand(variable_query(vs[name]), selected))
        assert m is not None
        values = prom.label_values(m.group("selector"), m.group("label"))
        regex = vs[name].get("regex") or ""
        if regex:  # Grafana keeps the first capture group of the variable's /regex/
            pattern = re.compile(regex.strip("/"))
            values = {g.group(1) for v in values if (g := pattern.match(v))}
        return values

    assert listed("namespace", ALL) == {"prod", "research"}
    assert listed("model", ALL) == {"prod/chat", "prod/embed", "research/llm"}
    assert listed("model", {"namespace": ["prod"]}) == {"prod/chat", "prod/embed"}
    assert listed("team", ALL) == {"search", "ml"}
    assert listed("team", {"namespace": ["research"]}) == {"ml"}


def test_selecting_a_model_leaves_only_its_series(dashboard, prom) -> None:
    chosen = {"model": ["prod/embed"]}
    seen_models = set()
    for panel, target in targets(dashboard):
        for r in prom.query(expand(target["expr"], chosen)):
            if "model" in r["metric"]:
                seen_models.add(r["metric"]["model"])
                assert r["metric"]["model"] == "prod/embed", (panel["title"], r)
    assert seen_models == {"prod/embed"}
    # a multi-value selection (Grafana's "(a|b)") keeps both
    both = {"model": ["prod/embed", "research/llm"]}
    stale = _panel(dashboard, "Metrics stale")["targets"][0]["expr"]
    assert {r["metric"]["model"]: r["value"] for r in prom.query(expand(stale, both))} == {
        "prod/embed": 0.0, "research/llm": 1.0}


def _panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in query_panels(dashboard) if p["title"] == title)


def _by(results: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): r["value"] for r in results}


def _values(prom: Evaluated, dashboard: dict[str, Any], title: str, label: str, ref: str = "A") -> dict[str, float]:
    target = next(t for t in _panel(dashboard, title)["targets"] if t["refId"] == ref)
    return _by(prom.query(expand(target["expr"], ALL)), label)


def test_slo_panels_show_attainment_budget_and_burn(dashboard, prom) -> None:
    """chat: 10% late against a p95 objective -> attainment 0.9, burn 0.1 / 0.05 = 2, budget 1 - 2 = -100%;
    embed: nothing late; llm (stale) counts nothing, so it has no attainment at all (not a perfect one)."""
    attainment = _values(prom, dashboard, "SLO attainment over the range", "model")
    assert set(attainment) == {"prod/chat", "prod/embed"}
    assert attainment["prod/chat"] == pytest.approx(0.9, abs=1e-9)
    assert attainment["prod/embed"] == pytest.approx(1.0, abs=1e-9)
    budget = _values(prom, dashboard, "Error budget left over the range", "model")
    assert budget["prod/chat"] == pytest.approx(-1.0, abs=1e-6)
    assert budget["prod/embed"] == pytest.approx(1.0, abs=1e-9)
    for ref in ("A", "B"):  # 1h and 6h windows (6h reaches back past the history's start: still the share)
        burn = _values(prom, dashboard, "Error-budget burn rate", "model", ref)
        assert burn["prod/chat"] == pytest.approx(2.0, rel=1e-6)
        assert burn["prod/embed"] == pytest.approx(0.0, abs=1e-9)
    replicas = _values(prom, dashboard, "Replicas: desired vs current", "model", "A")
    assert replicas == {"prod/chat": 2.0, "prod/embed": 1.0, "research/llm": 1.0}
    short = _values(prom, dashboard, "Shortfall: replicas wanted but unplaceable", "model")
    assert short == {"prod/chat": 1.0}


def test_cost_panels_show_gpu_hours_cost_idle_and_prices(dashboard, prom) -> None:
    """Over the 1 h range: search holds a whole L4 (1) and a 3g slice (3/7 of an A100), ml one 3g slice."""
    fraction = {k: (len(s.devices) if s.kind.name == "WHOLE" else s.compute_fraction) for k, s in
                prom.fleet.slots.items()}
    hours = RANGE_S / 3600.0
    gpu_hours = {
        "search": (fraction["prod/chat"] + fraction["prod/embed"]) * hours,
        "ml": fraction["research/llm"] * hours,
    }
    assert fraction["prod/chat"] == 1 and fraction["prod/embed"] == pytest.approx(3 / 7)
    got = _values(prom, dashboard, "GPU-hours per team over the range", "team")
    assert got == pytest.approx(gpu_hours, rel=1e-6)
    cost = {
        "search": (fraction["prod/chat"] * PRICES["L4-24GB"] + fraction["prod/embed"] * PRICES["A100-80GB"]) * hours,
        "ml": fraction["research/llm"] * PRICES["A100-80GB"] * hours,
    }
    assert _values(prom, dashboard, "Cost per team over the range", "team") == pytest.approx(cost, rel=1e-6)
    per_model = _values(prom, dashboard, "Cost per model over the range", "model")
    assert per_model["prod/chat"] == pytest.approx(PRICES["L4-24GB"] * hours, rel=1e-6)
    assert sum(per_model.values()) == pytest.approx(sum(cost.values()), rel=1e-6)
    rate = _values(prom, dashboard, "Cost rate per team (USD per hour)", "team")
    assert rate == pytest.approx({k: v / hours for k, v in cost.items()}, rel=1e-6)
    # idle reserved: the A100 node holds inference -> its slack (1 - 6/7 on GPU 0, all of GPU 1); the L4 is full
    idle_gpus = {"A100-80GB": (1 - 6 / 7) + 1.0, "L4-24GB": 0.0}
    idle = _values(prom, dashboard, "Idle reserved GPU-hours over the range", "gpu_model")
    assert idle == pytest.approx({k: v * hours for k, v in idle_gpus.items()}, rel=1e-6, abs=1e-9)
    idle_cost = _values(prom, dashboard, "Idle reserved cost over the range", "gpu_model")
    assert idle_cost == pytest.approx({k: v * hours * PRICES[k] for k, v in idle_gpus.items()}, rel=1e-6, abs=1e-9)
    assert _values(prom, dashboard, "GPU price table", "gpu_model") == PRICES


def test_fleet_panels_show_slots_leader_and_controller_health(dashboard, prom) -> None:
    slots = _panel(dashboard, "GPU slots by GPU kind")["targets"][0]["expr"]
    got = {(r["metric"]["gpu_model"], r["metric"]["state"]): r["value"] for r in prom.query(expand(slots, ALL))}
    assert got[("A100-80GB", "used")] == pytest.approx(6 / 7)
    assert got[("A100-80GB", "lent")] == pytest.approx(1.0)
    assert got[("L4-24GB", "used")] == pytest.approx(1.0) and got[("L4-24GB", "free")] == pytest.approx(0.0)
    assert _values(prom, dashboard, "Leaders", "") == {"": 1.0}
    assert _values(prom, dashboard, "Models with stale metrics", "") == {"": 1.0}
    assert _values(prom, dashboard, "Replicas short", "") == {"": 1.0}
    errors = _values(prom, dashboard, "Errors over the range", "")
    assert errors[""] == pytest.approx(120 / 10, rel=0.15)  # one error every 10 ticks of 30 s
    decisions = _values(prom, dashboard, "Decisions by reason", "reason")
    assert set(decisions) == {"unplaceable", "stable", "metrics_stale"}
    ticks = {t["legendFormat"]: prom.query(expand(t["expr"], ALL)) for t in
             _panel(dashboard, "Tick duration")["targets"]}
    assert all(0.0 < r[0]["value"] <= 0.1 for r in ticks.values()), ticks


def test_team_panels_show_gpus_shortfall_preemptions_and_refusals(dashboard, prom) -> None:
    """search holds a whole L4 and a 3g slice (1 + 3/7) of its 2 guaranteed (limit 3); ml a 3g slice of its 1 (no
    limit); chat is 1 short (unplaceable) and refused 1 replica per 30 s tick within search's guarantee; llm loses
    a replica every 10 minutes."""
    target = _panel(dashboard, "Team GPUs: held vs guaranteed")["targets"][0]["expr"]
    got = {(r["metric"]["team"], r["metric"]["kind"]): r["value"] for r in prom.query(expand(target, ALL))}
    assert got == pytest.approx({("search", "held"): 1 + 3 / 7, ("search", "guaranteed"): 2.0,
                                 ("search", "limit"): 3.0, ("ml", "held"): 3 / 7, ("ml", "guaranteed"): 1.0})
    assert _values(prom, dashboard, "Shortfall by cause", "reason") == {"unplaceable": 1.0}
    per_range = RANGE_S / TICK_S
    refusals = _values(prom, dashboard, "Guarantee refusals over the range", "model")
    assert refusals == pytest.approx({"prod/chat": per_range}, rel=0.05)
    preempted = _values(prom, dashboard, "Preemptions per model over the range", "model")
    assert set(preempted) == {"prod/chat", "prod/embed", "research/llm"}  # every model's series exists (at 0)
    assert preempted["prod/chat"] == 0 and preempted["prod/embed"] == 0
    assert preempted["research/llm"] == pytest.approx(per_range / PREEMPT_EVERY, abs=1.5)
    recent = _values(prom, dashboard, "Preemptions by team and reason", "team")
    assert set(recent) == {"ml", "search"}
    # the team variable narrows the team panels
    only_ml = {(r["metric"]["team"], r["metric"]["kind"]) for r in prom.query(expand(target, {"team": ["ml"]}))}
    assert only_ml == {("ml", "held"), ("ml", "guaranteed")}
