"""A real Prometheus for tests: the Debian package's binary on 127.0.0.1, a temp TSDB, history backfilled.

Use it from a test module with ``pytest_plugins = ("realparts.prometheus",)`` and the ``prometheus_factory``
fixture, or call :func:`running_prometheus` directly.

How history gets in without waiting hours: the test writes OpenMetrics text (``openmetrics_counter``) with
samples over the last few hours, ``promtool tsdb create-blocks-from openmetrics FILE DIR`` turns it into TSDB
blocks in the (empty) storage directory, and only then Prometheus starts and opens them.

What was checked with Debian 12's prometheus 2.42.0 (and why no extra flag is needed):
- Samples right up to "now" backfill fine: promtool cuts 2 h-aligned blocks, the last one ending at the newest
  sample, and Prometheus serves them at once. Without scrape targets the head is empty (nothing is
  scraped), so the blocks overlap nothing; and since 2.39 overlapping blocks are allowed anyway -- the
  ``--storage.tsdb.allow-overlapping-blocks`` flag is gone from 2.42's help. No need to keep samples older
  than 2 h either.
- Backfill BEFORE start: Prometheus reads the block list when it opens the TSDB, so the history is there for
  the first query (a running server would only notice new block folders at a later reload).
- OpenMetrics for promtool: timestamps in seconds, the file must end with ``# EOF``.
- ``/-/ready`` answers within a fraction of a second after start.

Scraping live targets: ``scrape_targets`` (a list of ``("host:port", {label: value})``) become one scrape
job with a static config per target, its labels attached to every series scraped from it (so a test gives
each model server its ``namespace``, as a Kubernetes ServiceMonitor would), every ``scrape_interval_s``
(1 s in tests; the scrape timeout is the interval, at most 10 s). ``PrometheusServer.stop()`` stops it
early (a test of an unreachable Prometheus).

If the binaries are missing they are installed with apt (as root, ``--no-install-recommends``, ~15 s); if
that is impossible the tests SKIP with the reason. On a host with systemd the package also starts its own
service on :9090; the tests never use it (they pick a free port).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

READY_TIMEOUT_S = 30.0
DEFAULT_SCRAPE_INTERVAL_S = 15.0
ScrapeTarget = tuple[str, Mapping[str, str]]  # ("host:port", labels attached to everything scraped there)


@dataclass(frozen=True)
class PrometheusServer:
    url: str  # http://127.0.0.1:PORT
    port: int
    tsdb: Path
    log: Path
    process: subprocess.Popen | None = field(default=None, compare=False, repr=False)

    def stop(self) -> None:
        """Stop the server now (idempotent); the fixture's own stop at the end is then a no-op."""
        if self.process is not None:
            _stop(self.process)


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _yaml_str(s: str) -> str:
    # JSON strings are valid YAML flow scalars: any label value or target is quoted safely
    return json.dumps(str(s))


def prometheus_config(
    scrape_targets: Sequence[ScrapeTarget] | None = None, scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
) -> str:
    """The config file: global intervals and, with targets, one job ``models`` with a static config each."""
    interval = _duration(scrape_interval_s)
    lines = ["global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}"]
    if scrape_targets:
        lines += [
            "scrape_configs:",
            "  - job_name: models",
            f"    scrape_interval: {interval}",
            f"    scrape_timeout: {_duration(min(scrape_interval_s, 10.0))}",
            "    static_configs:",
        ]
        for target, labels in scrape_targets:
            lines.append(f"      - targets: [{_yaml_str(target)}]")
            if labels:
                lines.append("        labels:")
                lines += [f"          {_yaml_str(k)}: {_yaml_str(v)}" for k, v in labels.items()]
    return "\n".join(lines) + "\n"


def _apt_install() -> str | None:
    """Install the Debian package; None on success, else why not."""
    if shutil.which("apt-get") is None:
        return "apt-get not found (not a Debian-like system)"
    if os.geteuid() != 0:
        return "not root, cannot apt-get install prometheus (install it: apt-get install prometheus)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # stale package lists on a fresh machine: update once, try again
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"apt-get install prometheus failed: {exc}"
    if done.returncode != 0:
        return f"apt-get install prometheus failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    return None


def ensure_binaries() -> tuple[str, str]:
    """Paths of ``prometheus`` and ``promtool``, installing the package when missing; SKIP if impossible."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom and tool:
        return prom, tool
    why = _apt_install()
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom and tool:
        return prom, tool
    pytest.skip(f"a real Prometheus is needed and cannot be installed: {why or 'binaries still not on PATH'}")


def openmetrics_counter(
    metric: str, series: Mapping[str, Sequence[tuple[float, float]]], label: str = "model", help_text: str = "x"
) -> str:
    """OpenMetrics text for one counter family: ``{metric}_total{label="name"} value timestamp`` per sample.

    ``series``: label value -> [(unix seconds, counter value)], oldest first (a gap is simply no samples).
    """
    family = metric.removesuffix("_total")
    lines = [f"# HELP {family} {help_text}", f"# TYPE {family} counter"]
    for name, samples in series.items():
        lines.extend(f'{family}_total{{{label}="{name}"}} {v!r} {t!r}' for t, v in samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backfill(promtool: str, openmetrics: str, tsdb: Path) -> None:
    tsdb.mkdir(parents=True, exist_ok=True)
    src = tsdb.parent / "backfill.om"
    src.write_text(openmetrics)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed (exit {done.returncode}): {done.stderr or done.stdout}")


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1.0) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running_prometheus(
    workdir: Path,
    openmetrics: str | None = None,
    scrape_targets: Sequence[ScrapeTarget] | None = None,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
) -> Iterator[PrometheusServer]:
    """Backfill ``openmetrics`` (if given) into a fresh TSDB under ``workdir``, start Prometheus on a free
    loopback port scraping ``scrape_targets`` (if any) every ``scrape_interval_s``, wait for ``/-/ready``,
    yield, stop it."""
    prom, tool = ensure_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    tsdb = workdir / "tsdb"
    if openmetrics is not None:
        backfill(tool, openmetrics, tsdb)
    tsdb.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(prometheus_config(scrape_targets, scrape_interval_s))
    log = workdir / "prometheus.log"
    for _attempt in range(3):  # the free port can be taken between probing and binding: retry
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [
                    prom,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tsdb}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=30d",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None and not _ready(url):
            time.sleep(0.1)
        if proc.poll() is None and _ready(url):
            break
        _stop(proc)
        if "address already in use" not in log.read_text():
            raise RuntimeError(f"prometheus did not become ready on {url}; log:\n{log.read_text()[-2000:]}")
    else:
        raise RuntimeError(f"prometheus could not bind a free port; log:\n{log.read_text()[-2000:]}")
    try:
        yield PrometheusServer(url=url, port=port, tsdb=tsdb, log=log, process=proc)
    finally:
        _stop(proc)


def wait_scraped(url: str, targets: int, timeout_s: float = 30.0) -> None:
    """Until Prometheus at ``url`` reports ``targets`` scrape targets up (it applies new targets a few seconds after
    start); AssertionError after ``timeout_s``."""
    import json
    import urllib.parse
    import urllib.request

    query = urllib.parse.urlencode({"query": "count(up == 1)"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as r:
            result = json.load(r)["data"]["result"]
        if result and float(result[0]["value"][1]) >= targets:
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not scrape all {targets} model servers within {timeout_s}s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``start(openmetrics_text_or_None, scrape_targets=None, scrape_interval_s=15) -> PrometheusServer``:
    each call starts one real Prometheus with that history backfilled, scraping those targets; all are
    stopped when the module's tests are done."""
    with ExitStack() as stack:

        def start(
            openmetrics: str | None = None,
            scrape_targets: Sequence[ScrapeTarget] | None = None,
            scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
        ) -> PrometheusServer:
            workdir = tmp_path_factory.mktemp("prometheus")
            return stack.enter_context(running_prometheus(workdir, openmetrics, scrape_targets, scrape_interval_s))

        yield start
