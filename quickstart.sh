#!/usr/bin/env bash
# One command sets up everything and runs either the demo or the whole test suite.
#   ./quickstart.sh demo   -> venv + install + `slotwise simulate` on the bundled Azure LLM trace
#   ./quickstart.sh test   -> venv + install (with test extras) + ruff + the whole pytest suite
# Works on a fresh Debian 12 with Python 3.11: installs python3-venv with apt when it is missing.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${SLOTWISE_VENV:-.venv}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_python() {
  if ! command -v "$PY" >/dev/null; then
    as_root apt-get update -qq && as_root apt-get install -y -qq python3 python3-venv python3-pip
  fi
  if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    as_root apt-get update -qq && as_root apt-get install -y -qq python3-venv
  fi
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "slotwise needs Python >= 3.11 (found $("$PY" --version))" >&2; exit 1; }
}

# The tests start a real Prometheus (tests/realparts/prometheus.py) from Debian's package. The fixture installs
# it itself when run as root and skips those tests otherwise; installing here (with sudo if needed) makes
# `./quickstart.sh test` run them on a fresh Debian 12 either way. Skipped when both binaries are on PATH.
ensure_prometheus() {
  if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends prometheus
  fi
}

ensure_venv() {
  ensure_python
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e ".$1"
}

case "${1:-demo}" in
  demo)
    ensure_venv ""
    shift || true
    # The first 15 minutes of the bundled hour are the controller's history (its forecaster's warm
    # start, as Prometheus history is in a cluster); the rest is simulated and scored.
    exec "$VENV/bin/slotwise" simulate --history-hours 0.25 --out slotwise-report "$@"
    ;;
  test)
    ensure_venv "[test]"
    ensure_prometheus
    # helm for the chart's tests (a pinned static binary, cached in ~/.cache/slotwise/helm); the tests fetch it
    # themselves too, this only does it up front
    PYTHON="$VENV/bin/python" bash scripts/ensure-helm.sh >/dev/null || echo "helm unavailable: the chart tests will skip" >&2
    shift || true
    "$VENV/bin/ruff" check .
    "$VENV/bin/python" -m pytest -q "$@"
    ;;
  *)
    echo "usage: $0 demo|test [args...]" >&2; exit 2 ;;
esac
