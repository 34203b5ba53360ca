"""``slotwise report``: the PoC scorecard -- cost per team and model, idle reserved cost, lent value, waiting,
SLO attainment and fragmentation -- from a simulation's JSON or from Prometheus history.

    slotwise report --sim scorecard.json [--price H100=2.9 ...] [--out DIR]
    slotwise report --prometheus http://prometheus:9090 --hours 24 [--end TIME] [--out DIR]
    slotwise report --prometheus https://prometheus:9091 --prometheus-ca-file ca.pem \
        --prometheus-bearer-token-file /var/run/secrets/kubernetes.io/serviceaccount/token

Prints tables; with ``--out`` also writes ``report.json``, ``report.png`` and a self-contained ``report.html``.
Bad input (a missing file, a JSON that is not a simulation's, an unreachable Prometheus) is one line, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from datetime import datetime

from autoscaler.live.prometheus.client import PrometheusAuth
from autoscaler.live.prometheus.report import read_report
from autoscaler.report.data import Section, load_simulation, override_prices, sections_from_simulation
from autoscaler.report.prometheus import section_from_prometheus
from autoscaler.report.render import print_report, write_all


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="cost per team/model, idle and lent capacity, SLO attainment (PoC report)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sim", default=None, metavar="FILE", help="the JSON `slotwise simulate --json` wrote")
    src.add_argument("--prometheus", default=None, metavar="URL", help="Prometheus holding slotwise's metrics")
    p.add_argument("--hours", type=float, default=24.0, help="with --prometheus: the range to report (default 24)")
    p.add_argument("--end", default=None,
                   help="with --prometheus: end of the range, unix seconds or ISO 8601 (default: now)")
    # TLS is verified unless --prometheus-insecure-skip-verify; secrets only from files (not on the command line,
    # where `ps` shows them)
    p.add_argument("--prometheus-ca-file", default=None, metavar="PEM",
                   help="with --prometheus: CA bundle the server certificate must chain to (default: system store)")
    p.add_argument("--prometheus-insecure-skip-verify", action="store_true",
                   help="with --prometheus: do not verify its TLS certificate (never the default)")
    p.add_argument("--prometheus-cert-file", default=None, metavar="PEM", help="client certificate (mutual TLS)")
    p.add_argument("--prometheus-key-file", default=None, metavar="PEM", help="its private key")
    p.add_argument("--prometheus-bearer-token-file", default=None, metavar="FILE",
                   help="with --prometheus: send the token in this file as Authorization: Bearer (re-read per query)")
    p.add_argument("--prometheus-username", default=None, help="with --prometheus: HTTP basic auth user")
    p.add_argument("--prometheus-password-file", default=None, metavar="FILE",
                   help="with --prometheus: the basic-auth password, from this file")
    p.add_argument("--price", action="append", default=[], metavar="KIND=USD",
                   help="USD per GPU-hour for a GPU kind (any accepted name), repeatable: re-prices the report")
    p.add_argument("--out", default=None, metavar="DIR", help="write report.json, report.png and report.html here")
    p.set_defaults(func=run)


def parse_prices(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not kind.strip() or not (math.isfinite(price) and price >= 0):
            raise ValueError(f"--price {item!r}: expected KIND=USD with a non-negative number, e.g. H100=2.9")
        out[kind.strip()] = price
    return out


def parse_end(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--end {text!r}: expected unix seconds or an ISO 8601 time") from None
    return dt.timestamp()  # a naive time is local time, as `date` prints it


def prometheus_auth(args: argparse.Namespace) -> PrometheusAuth:
    """The ``--prometheus-*`` TLS and credential flags as one :class:`PrometheusAuth` (ValueError: exit 2)."""
    return PrometheusAuth(
        ca_file=args.prometheus_ca_file, insecure_skip_verify=bool(args.prometheus_insecure_skip_verify),
        cert_file=args.prometheus_cert_file, key_file=args.prometheus_key_file,
        bearer_token_file=args.prometheus_bearer_token_file, username=args.prometheus_username,
        password_file=args.prometheus_password_file)


def build(args: argparse.Namespace) -> tuple[list[Section], dict[str, object]]:
    """The report's sections and its metadata, from the arguments (no output)."""
    prices = parse_prices(args.price)
    if args.sim is not None:
        doc = load_simulation(args.sim)
        meta = {"source": "simulation", "input": args.sim, "trace": doc.get("trace")}
        return sections_from_simulation(doc, prices, source=args.sim), meta
    end = parse_end(args.end)
    end = time.time() if end is None else end
    if not (math.isfinite(args.hours) and args.hours > 0):
        raise ValueError(f"--hours must be positive, got {args.hours}")
    override_prices(prices)  # a bad --price fails before Prometheus is asked
    auth = prometheus_auth(args)
    # the one Prometheus client is async; a PrometheusError is an OSError: one line, exit 2
    readings = asyncio.run(read_report(args.prometheus, args.hours, end, auth=auth))
    section = section_from_prometheus(readings, prices)
    meta = {"source": "prometheus", "input": args.prometheus, "hours": args.hours, "end": end}
    return [section], meta


def run(args: argparse.Namespace) -> int:
    sections, meta = build(args)
    print_report(sections)
    if args.out:
        paths = write_all(sections, meta, args.out)
        for p in paths.values():
            print(f"wrote {p}")
    return 0
