"""``slotwise run``: the controller against a real cluster (in-cluster config, else a kubeconfig).

Without a cluster there is nothing to run against: the message says so and points to ``slotwise simulate``,
which runs the same control loop on a simulated cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from autoscaler.api.spec import SpecLimits
from autoscaler.decision.arbitration import ArbitrationPolicy
from autoscaler.estimation.idle_times import IdleTimes
from autoscaler.live.controller import Controller, ControllerSettings
from autoscaler.live.kube.actuator import ActuatorConfig
from autoscaler.live.prometheus.client import PrometheusAuth, PrometheusClient, PrometheusError
from autoscaler.live.prometheus.history import warm_start_from_prometheus
from autoscaler.live.prometheus.metrics import MetricNames, preset_names
from sharing.lending import LendingPolicy

log = logging.getLogger("slotwise.run")

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
NO_CLUSTER = (
    "no Kubernetes cluster to run against: not in a pod (no service-account token), no --kubeconfig, "
    "no KUBECONFIG and no ~/.kube/config. To try slotwise without a cluster, run `slotwise simulate` "
    "(the same control loop on a simulated cluster driven by a real trace)."
)


# The warm start's history: one step per minute (the forecaster's step), one range query for all models
# (chunked past 11,000 points), each request given this long (24 h of a big fleet is a heavy query).
WARM_START_STEP_S = 60.0
IDLE_HISTORY_RANGE_S = 4 * 3600.0  # the idle-time histograms' widest range (Shahrad et al.'s 4 h)
WARM_START_TIMEOUT_S = 60.0


class NoCluster(RuntimeError):
    pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the controller against a Kubernetes cluster")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--config", default=None, help="controller settings (YAML; see docs/kubernetes.md)")
    p.add_argument("--prometheus", default=None, help="Prometheus URL for model metrics (e.g. http://prom:9090)")
    p.add_argument("--metrics-preset", default=None, choices=preset_names(),
                   help="model server metric names (docs/metrics.md)")
    p.add_argument("--dry-run", action="store_true",
                   help="compute and log the plan; write nothing at all (not even status, Events or the Lease)")
    p.add_argument("--report", action="store_true",
                   help="report mode: write only each model's status annotation and Events, change nothing else")
    p.add_argument("--namespace", default=None, help="manage Deployments in this namespace only")
    p.add_argument("--selector", default=None, help="manage only Deployments matching this label selector")
    p.add_argument("--policy", default=None, help="sizing policy (default slotwise)")
    p.add_argument("--tick", type=float, default=None, help="loop period in seconds")
    p.add_argument("--history-hours", type=float, default=None, help="warm-start the forecaster from Prometheus")
    p.add_argument("--lease-namespace", default=None, help="namespace of the leader-election Lease")
    p.add_argument("--lease-name", default=None)
    p.add_argument("--identity", default=None, help="this replica's identity in the Lease (default: hostname)")
    p.add_argument("--listen", default=None, help="HOST:PORT for /metrics, /healthz, /readyz (default 0.0.0.0:8080)")
    p.add_argument("--allow-mig-relayout", action="store_true",
                   help="let the actuator re-partition MIG GPUs (cordon, drain-wait, relabel, uncordon)")
    p.add_argument("--max-relayout-nodes", type=int, default=None)
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def load_settings_file(path: str) -> dict[str, Any]:
    """The YAML settings file: keys are :class:`ControllerSettings` fields, ``actuator:`` a mapping of
    :class:`ActuatorConfig` fields, ``metrics:`` ``{preset, names...}``, ``teams:`` the team quotas and their
    namespace / priority bindings (with ``arbitration:`` they make
    :class:`~autoscaler.decision.arbitration.ArbitrationPolicy`), ``limits:`` the caps on every model's annotations
    (:class:`~autoscaler.api.spec.SpecLimits`); unknown keys are errors."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    known = {f.name for f in fields(ControllerSettings)} | {"metrics", "teams"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return data


def _section(data: dict[str, Any], key: str, cls: type) -> Any:
    """``data[key]`` (a mapping of ``cls``'s fields, removed from ``data``) as a ``cls``; unknown keys are errors."""
    values = data.pop(key, {}) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{key}: expected a mapping of settings")
    known = {f.name for f in fields(cls)}
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"unknown {key} setting(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    return cls(**values)


def _arbitration(data: dict[str, Any]) -> ArbitrationPolicy:
    """``arbitration:`` (mode, preemption, ...) and ``teams:`` (the quotas), removed from ``data``, as one
    :class:`ArbitrationPolicy`. Two top-level keys because teams are an organisation's list, not a knob of the
    algorithm; one policy because the decision core needs them together. Errors name the key."""
    arbitration = data.pop("arbitration", None)
    teams = data.pop("teams", None)
    if arbitration is not None and not isinstance(arbitration, dict):
        raise ValueError(f"arbitration: expected a mapping of settings, got {arbitration!r}")
    try:
        return ArbitrationPolicy.from_mapping(arbitration, teams)
    except (TypeError, ValueError) as e:
        text = str(e)
        # from_mapping names the key itself ("arbitration: ...", "teams[1]: ..."); the policy's own checks
        # ("min_runtime_s must be ...") name only the field: say which section it belongs to
        if not text.startswith(("arbitration", "teams")):
            text = f"arbitration: {text}"
        raise ValueError(text) from None


def _limits(data: dict[str, Any]) -> None:
    """``limits:`` (a mapping of :class:`SpecLimits` fields) in ``data`` made a :class:`SpecLimits`, in place;
    errors name the key (``limits.max_replicas must be ...``, ``unknown limits setting(s) ...``)."""
    if "limits" not in data:
        return
    try:
        data["limits"] = _section(data, "limits", SpecLimits)
    except TypeError as e:
        raise ValueError(f"limits: {e}") from None


def build_settings(args: argparse.Namespace) -> ControllerSettings:
    data = load_settings_file(args.config) if args.config else {}
    actuator = _section(data, "actuator", ActuatorConfig)
    lending = _section(data, "lending", LendingPolicy)
    arbitration = _arbitration(data)
    _limits(data)
    if "prometheus_auth" in data:
        data["prometheus_auth"] = _section(data, "prometheus_auth", PrometheusAuth)
    metrics_data = data.pop("metrics", {}) or {}
    kv = data.get("kv_saturation")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, (int, float)) or not 0.0 < kv <= 1.0):
        raise ValueError(f"kv_saturation: expected a KV-cache fraction in (0, 1] or null (off), got {kv!r}")
    eb = data.get("exact_budget_s")
    if eb is not None and (isinstance(eb, bool) or not isinstance(eb, (int, float)) or not 0.0 <= eb <= 60.0):
        raise ValueError(f"exact_budget_s: expected seconds in [0, 60] (0: the packer's placement only), got {eb!r}")
    if args.dry_run:
        actuator = replace(actuator, dry_run=True)
    if args.report:
        actuator = replace(actuator, report_only=True)
    if args.allow_mig_relayout:
        actuator = replace(actuator, mig_relayout=True)
    if args.max_relayout_nodes is not None:
        actuator = replace(actuator, max_nodes_relayout=args.max_relayout_nodes)
    preset = args.metrics_preset or metrics_data.pop("preset", "vllm")
    metrics_data.pop("preset", None)
    try:
        names = MetricNames.preset(preset, **metrics_data)
    except TypeError as e:
        raise ValueError(f"metrics settings: {e}") from None
    settings = ControllerSettings(**data, actuator=actuator, metric_names=names, lending=lending,
                                  arbitration=arbitration)
    overrides = {
        "prometheus_url": args.prometheus, "namespace": args.namespace, "label_selector": args.selector,
        "policy": args.policy, "tick_s": args.tick, "history_hours": args.history_hours,
        "lease_namespace": args.lease_namespace, "lease_name": args.lease_name, "identity": args.identity,
    }
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        settings = replace(settings, http_host=host or "0.0.0.0", http_port=int(port))
    if settings.lease_namespace == "default" and os.environ.get("POD_NAMESPACE"):
        settings = replace(settings, lease_namespace=os.environ["POD_NAMESPACE"])
    return settings


async def client_configuration(kubeconfig: str | None) -> Any:
    """In-cluster config when running in a pod, else the kubeconfig (flag, $KUBECONFIG, ~/.kube/config)."""
    from kubernetes_asyncio import config as kconfig
    from kubernetes_asyncio.client import Configuration

    cfg = Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and IN_CLUSTER_TOKEN.exists():
        kconfig.load_incluster_config(client_configuration=cfg)
        return cfg
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not Path(path).is_file():
        if kubeconfig or os.environ.get("KUBECONFIG"):
            raise NoCluster(f"kubeconfig {path} does not exist")
        raise NoCluster(NO_CLUSTER)
    await kconfig.load_kube_config(config_file=path, client_configuration=cfg)
    return cfg


async def warm_start(controller: Controller) -> None:
    """Fold Prometheus history into the forecaster before the first decision: the request rate of each
    60 s step, read the way the live metrics window reads it (``autoscaler.live.prometheus.history``). A
    failure is logged and the controller starts cold."""
    s = controller.settings
    if not (s.prometheus_url and s.history_hours > 0):
        return
    forecaster = controller.core.forecaster_factory()
    try:
        async with PrometheusClient(s.prometheus_url, timeout_s=WARM_START_TIMEOUT_S, auth=s.prometheus_auth) as client:
            history = await warm_start_from_prometheus(
                forecaster, client, s.metric_names, controller.clock(), s.history_hours, WARM_START_STEP_S
            )
    except PrometheusError as e:
        log.warning("forecaster starts cold: %s", e)
        return
    controller.state.forecaster = forecaster
    # The same history warm-starts the idle times of the models that may go to zero (picked up at their first
    # decision; a model without min-replicas 0 ignores its entry). A wide range: the first sight only narrows it.
    end = math.floor(controller.clock() / WARM_START_STEP_S) * WARM_START_STEP_S
    controller.state.idle_history.update(
        {key: IdleTimes.from_rates(rate, WARM_START_STEP_S, end, keep_alive_s=IDLE_HISTORY_RANGE_S)
         for key, rate in history.items()})
    log.info("forecaster warm-started with %.1f h of history for %d model(s)", s.history_hours, len(history))


async def main_async(args: argparse.Namespace) -> int:
    from autoscaler.live.kube.client import TimeoutApiClient, request_timeout_for

    settings = build_settings(args)
    cfg = await client_configuration(args.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # every request the tick makes times out before a follower could acquire the Lease (live/kube/client.py)
    timeout_s = request_timeout_for(settings.lease_duration_s, settings.renew_deadline_s)
    async with TimeoutApiClient(configuration=cfg, request_timeout_s=timeout_s) as api:
        controller = Controller(api, settings)
        await warm_start(controller)
        mode = "DRY RUN" if settings.actuator.dry_run else "REPORT MODE" if settings.actuator.report_only else ""
        log.info("slotwise %s starting (identity %s, lease %s/%s)", mode,
                 settings.identity, settings.lease_namespace, settings.lease_name)
        await controller.run(stop)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(main_async(args))
    except NoCluster as e:
        print(f"slotwise: {e}", file=sys.stderr)
        return 2
