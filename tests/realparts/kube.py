"""A real kube-apiserver (v1.20.2) + etcd for tests, both on 127.0.0.1 with temp data, torn down afterwards.

Use it from a test module with ``pytest_plugins = ("realparts.kube",)`` and the session-scoped
``kube_apiserver`` fixture (a :class:`KubeApiserver`) or the per-test ``api`` fixture (an admin ApiClient on it),
or call :func:`running_kube_apiserver` directly.

Where the binary comes from: no registry ships kube-apiserver, so ``scripts/build-kube-apiserver.sh`` builds it
from Debian 12's ``kubernetes`` SOURCE package (Kubernetes 1.20.2, ~6.5 min on 2 cores) and caches ONLY the
binary in ``$SLOTWISE_KUBE_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/slotwise/kube-apiserver-v1.20.2``).
This fixture uses that cached binary (or ``$SLOTWISE_KUBE_APISERVER``, a path to one), runs the build script
when it is missing -- unless ``SLOTWISE_BUILD_KUBE=0`` -- and SKIPS with the reason when it cannot be had
(not root, no apt, no network, build failure: the build log's tail is in the skip message).
etcd is Debian's ``etcd-server`` (3.4), installed with apt when missing.

The server: token auth (one admin token in ``system:masters``), RBAC, service-account keys made with openssl,
the serving cert self-generated in the cert dir (its ``apiserver.crt`` is the CA to trust; SANs include
127.0.0.1). No controller-manager, scheduler or kubelet: objects are stored and served, nothing reconciles them
(no ReplicaSets from Deployments, namespaces never finalize, Pods never run) -- like controller-runtime's envtest.
API level is 1.20 (``policy/v1beta1`` Eviction, no CEL).

Processes are started directly with ``Popen(start_new_session=True)`` (never through a shell, so the PID is the
program's own, not a subshell's) and stopped by killing their process groups.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

KUBE_VERSION = "1.20.2"
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kube-apiserver.sh"
BUILD_TIMEOUT_S = 40 * 60
ETCD_READY_TIMEOUT_S = 30.0
APISERVER_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class KubeApiserver:
    url: str  # https://127.0.0.1:PORT
    token: str  # bearer token of "admin" (group system:masters)
    ca_file: Path  # the apiserver's self-generated serving cert, to trust
    kubeconfig: Path  # a kubeconfig file for kubectl / kopf / kubernetes_asyncio.config
    etcd_url: str
    workdir: Path
    apiserver_log: Path
    etcd_log: Path

    def client_configuration(self) -> Any:
        """A ``kubernetes_asyncio.client.Configuration`` for this server (admin token, CA verified)."""
        from kubernetes_asyncio.client import Configuration

        config = Configuration(
            host=self.url,
            api_key={"BearerToken": self.token},
            api_key_prefix={"BearerToken": "Bearer"},
            ssl_ca_cert=str(self.ca_file),
        )
        return config

    def api_client(self) -> Any:
        """A new ``kubernetes_asyncio.client.ApiClient`` (use ``async with``; it must be closed)."""
        from kubernetes_asyncio.client import ApiClient

        return ApiClient(configuration=self.client_configuration())


# --- binaries ----------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    if env := os.environ.get("SLOTWISE_KUBE_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "slotwise" / f"kube-apiserver-v{KUBE_VERSION}"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def ensure_apiserver() -> Path:
    """Path of the kube-apiserver binary: ``$SLOTWISE_KUBE_APISERVER``, else the cached build, else build it now
    (``scripts/build-kube-apiserver.sh``, minutes); SKIP when that is impossible."""
    if env := os.environ.get("SLOTWISE_KUBE_APISERVER"):
        if _executable(Path(env)):
            return Path(env)
        pytest.skip(f"SLOTWISE_KUBE_APISERVER={env} is not an executable file")
    binary = cache_dir() / "kube-apiserver"
    if _executable(binary):
        return binary
    if os.environ.get("SLOTWISE_BUILD_KUBE") == "0":
        pytest.skip(f"no cached kube-apiserver at {binary} and SLOTWISE_BUILD_KUBE=0 (run {BUILD_SCRIPT})")
    if shutil.which("apt-get") is None:
        pytest.skip(f"no cached kube-apiserver at {binary}, and building it needs a Debian machine (no apt-get)")
    if os.geteuid() != 0:
        pytest.skip(f"no cached kube-apiserver at {binary}, and building it needs root (run {BUILD_SCRIPT} as root)")
    if not BUILD_SCRIPT.is_file():
        pytest.skip(f"no cached kube-apiserver at {binary} and no build script at {BUILD_SCRIPT}")
    log = Path(tempfile.gettempdir()) / f"slotwise-kube-apiserver-build-{os.getpid()}.log"
    # pytest captures output; say on the real stderr why the session stalls for minutes
    print(
        f"\n[slotwise] building kube-apiserver v{KUBE_VERSION} from Debian's source package into {binary.parent} "
        f"(~7 min, once; set SLOTWISE_BUILD_KUBE=0 to skip instead); log: {log}",
        file=sys.__stderr__,
        flush=True,
    )
    started = time.monotonic()
    try:
        with log.open("w") as out:
            done = subprocess.run(
                ["bash", str(BUILD_SCRIPT)],
                stdout=subprocess.DEVNULL,
                stderr=out,
                timeout=BUILD_TIMEOUT_S,
                env={**os.environ, "SLOTWISE_KUBE_CACHE": str(binary.parent)},
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"building kube-apiserver failed: {exc}; log tail:\n{_tail(log)}")
    if done.returncode != 0 or not _executable(binary):
        pytest.skip(f"building kube-apiserver failed (exit {done.returncode}); log {log}, tail:\n{_tail(log)}")
    print(f"[slotwise] kube-apiserver built in {time.monotonic() - started:.0f} s", file=sys.__stderr__, flush=True)
    log.unlink(missing_ok=True)
    return binary


def ensure_etcd() -> str:
    """Path of ``etcd`` (Debian's etcd-server), installed with apt when missing; SKIP if impossible."""
    if found := shutil.which("etcd"):
        return found
    why = "apt-get not found"
    if shutil.which("apt-get") is not None and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "etcd-server"]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:  # stale package lists on a fresh machine: update once, try again
                subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            why = f"apt-get install etcd-server: exit {done.returncode}: {done.stderr.strip()[-300:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"apt-get install etcd-server failed: {exc}"
    elif os.geteuid() != 0:
        why = "not root, cannot apt-get install etcd-server"
    if found := shutil.which("etcd"):
        return found
    pytest.skip(f"etcd is needed and cannot be installed: {why}")


# --- processes -----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop the process group the process leads (it was started with ``start_new_session``)."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:  # group signalling failed somehow: the process itself
        proc.kill()
        proc.wait(timeout=10)


def _popen(cmd: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _wait(proc: subprocess.Popen, ready, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            return True
        time.sleep(0.2)
    return proc.poll() is None and ready()


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as r:
            return r.status == 200 and json.loads(r.read()).get("health") == "true"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _apiserver_ready(url: str, token: str) -> bool:
    # the serving cert is generated at start-up: poll without verifying, verify for real in the tests
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=2.0, context=ctx) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _service_account_keys(key: Path, pub: Path) -> None:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
    except ImportError:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("neither openssl nor the cryptography package is there to make service-account keys")
        subprocess.run([openssl, "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=60)
        subprocess.run(
            [openssl, "rsa", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True, timeout=60
        )
        return
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    pub.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _kubeconfig(url: str, token: str, ca_file: Path) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "slotwise-test", "cluster": {"server": url, "certificate-authority": str(ca_file)}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "slotwise-test", "context": {"cluster": "slotwise-test", "user": "admin"}}],
            "current-context": "slotwise-test",
        },
        indent=2,
    )


def _start_etcd(etcd: str, workdir: Path) -> tuple[subprocess.Popen, str, Path]:
    log = workdir / "etcd.log"
    for _attempt in range(3):  # a free port can be taken between probing and binding: retry
        client, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        data = workdir / f"etcd-data-{client}"
        proc = _popen(
            [
                etcd,
                "--name=slotwise-test",
                f"--data-dir={data}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=slotwise-test={peer_url}",
                "--initial-cluster-state=new",
                "--log-level=warn",
            ],
            log,
        )
        if _wait(proc, lambda url=url: _etcd_healthy(url), ETCD_READY_TIMEOUT_S):
            return proc, url, log
        _stop(proc)
        if "address already in use" not in _tail(log, 5000):
            raise RuntimeError(f"etcd did not become healthy on {url}; log:\n{_tail(log)}")
    raise RuntimeError(f"etcd could not bind free ports; log:\n{_tail(log)}")


def _start_apiserver(
    binary: Path, etcd_url: str, workdir: Path, token: str, extra_args: Sequence[str] = ()
) -> tuple[subprocess.Popen, str, Path, Path]:
    """-> (process, url, log, the CA file to trust: the serving cert the apiserver made in its cert dir).
    ``extra_args`` come last: a flag given again there overrides the default above (e.g. a dual-stack
    ``--service-cluster-ip-range`` with ``--feature-gates=IPv6DualStack=true``, alpha in 1.20)."""
    tokens = workdir / "tokens.csv"
    tokens.write_text(f'{token},admin,admin,"system:masters"\n')
    sa_key, sa_pub = workdir / "sa.key", workdir / "sa.pub"
    _service_account_keys(sa_key, sa_pub)
    log = workdir / "kube-apiserver.log"
    for _attempt in range(3):
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        cert_dir = workdir / f"certs-{port}"
        cert_dir.mkdir()
        proc = _popen(
            [
                str(binary),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                "--insecure-port=0",
                f"--cert-dir={cert_dir}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                *extra_args,
            ],
            log,
        )
        if _wait(proc, lambda url=url: _apiserver_ready(url, token), APISERVER_READY_TIMEOUT_S):
            return proc, url, log, cert_dir / "apiserver.crt"
        _stop(proc)
        if "address already in use" not in _tail(log, 5000):
            raise RuntimeError(f"kube-apiserver did not become ready on {url}; log:\n{_tail(log, 3000)}")
    raise RuntimeError(f"kube-apiserver could not bind a free port; log:\n{_tail(log, 3000)}")


def _fast_tmp() -> str | None:
    """/dev/shm when it is writable and roomy (etcd fsyncs a lot and preallocates 64 MB WAL files; memory beats a
    shared, busy disk), else None (the default temp dir). Docker's default /dev/shm is only 64 MB: not used then."""
    shm = "/dev/shm"
    try:
        stat = os.statvfs(shm)
    except OSError:
        return None
    roomy = stat.f_bavail * stat.f_frsize >= 1 << 30
    return shm if roomy and os.access(shm, os.W_OK) else None


@contextmanager
def running_kube_apiserver(workdir: Path | None = None, extra_args: Sequence[str] = ()) -> Iterator[KubeApiserver]:
    """Start etcd and kube-apiserver on free loopback ports, wait for ``/readyz``, yield, stop both and remove
    the temp dir (``workdir`` if given is kept, only its contents are made here). ``extra_args``: more
    kube-apiserver flags (last: they override the defaults)."""
    binary, etcd = ensure_apiserver(), ensure_etcd()
    own_dir = workdir is None
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="slotwise-kube-", dir=_fast_tmp()))
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        etcd_proc, etcd_url, etcd_log = _start_etcd(etcd, workdir)
        procs.append(etcd_proc)
        token = secrets.token_hex(16)
        api_proc, url, api_log, ca_file = _start_apiserver(binary, etcd_url, workdir, token, extra_args)
        procs.append(api_proc)
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(_kubeconfig(url, token, ca_file))
        yield KubeApiserver(
            url=url,
            token=token,
            ca_file=ca_file,
            kubeconfig=kubeconfig,
            etcd_url=etcd_url,
            workdir=workdir,
            apiserver_log=api_log,
            etcd_log=etcd_log,
        )
    finally:
        for proc in reversed(procs):  # apiserver first, then etcd
            _stop(proc)
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[KubeApiserver]:
    """One real kube-apiserver 1.20.2 + etcd for the whole session (built and cached on first use)."""
    with running_kube_apiserver() as server:
        yield server


@pytest_asyncio.fixture
async def api(kube_apiserver: KubeApiserver) -> AsyncIterator[Any]:
    """An admin ``kubernetes_asyncio`` ApiClient on the session's server, closed after the test."""
    async with kube_apiserver.api_client() as api_client:
        yield api_client
