"""TLS verification and credentials of the one Prometheus client, against a REAL Prometheus (Debian's 2.42)
serving HTTPS with basic auth from its ``--web.config.file`` (supported since 2.24).

The certificates are made here with the ``openssl`` CLI: a CA, a server certificate it signs for 127.0.0.1, a
second (wrong) CA, and a client certificate for the mutual-TLS Prometheus. Prometheus' web config knows basic
auth only, so the bearer token is checked by a small aiohttp gate in front of the real Prometheus (what
kube-rbac-proxy or an OAuth proxy does in a cluster): it answers 401 unless the token is the CURRENT one and
passes the query on otherwise -- rotating the token file shows the client re-reads it.

What each test shows:
- verification is on by default: an ``https://`` Prometheus with a certificate the system does not trust is
  refused (``certificate verify failed``), and so is one signed by another CA than ``ca_file``;
- with the right ``ca_file`` and basic auth a query answers; without credentials or with a wrong password
  Prometheus says 401 and the client raises :class:`PrometheusError`;
- ``insecure_skip_verify: true`` (only when written) accepts the certificate;
- a session given by the caller (the metrics window's) gets the TLS settings and credentials too (per request);
- a mutual-TLS Prometheus answers only a client presenting its certificate;
- the bearer token comes from its file at every request: after a rotation the next query uses the new token;
- ``slotwise report --prometheus https://...`` takes the same settings as flags and reaches the secured
  Prometheus (which holds nothing of slotwise's: the report says so), and fails, exit 2, one line, on the
  certificate without the CA and with 401 without the password.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from autoscaler.cli.main import main as slotwise
from autoscaler.live.prometheus.client import PrometheusAuth, PrometheusClient, PrometheusError
from autoscaler.live.prometheus.report import read_report

pytest_plugins = ("realparts.prometheus",)

USER, PASSWORD = "slotwise", "s3cret-pw"
# bcrypt of PASSWORD for Prometheus' basic_auth_users, cost 4 so that each request stays fast (made once with
# `crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))`; the stdlib has no bcrypt beyond 3.12)
PASSWORD_BCRYPT = "$2b$04$noq7oNqEASJjQk95Cg.5mO1.jDk7OQdQLBMatrG7Q3gvL8h5oISw."
TOKEN_A, TOKEN_B = "token-a-0123456789", "token-b-9876543210"


# --- certificates ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def _signed(d: Path, name: str, ca: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _signed(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return Certs(d / "ca.pem", d / "other-ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
                 d / "client.key")


# --- a real Prometheus with a web config ----------------------------------------------------------------------


@dataclass(frozen=True)
class Secured:
    url: str  # https://127.0.0.1:PORT


@contextlib.contextmanager
def _secured_prometheus(workdir: Path, certs: Certs, *, mutual: bool) -> Iterator[Secured]:
    from realparts.prometheus import _stop, ensure_binaries, free_port, prometheus_config

    prom, _ = ensure_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(prometheus_config())
    tls = [f"  cert_file: {certs.server_cert}", f"  key_file: {certs.server_key}"]
    if mutual:
        tls += ["  client_auth_type: RequireAndVerifyClientCert", f"  client_ca_file: {certs.ca}"]
    web_config = workdir / "web.yml"
    web_config.write_text("\n".join(["tls_server_config:", *tls, "basic_auth_users:",
                                     f"  {USER}: {json.dumps(PASSWORD_BCRYPT)}"]) + "\n")
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if mutual:
        ctx.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    auth = PrometheusAuth(username=USER, password=PASSWORD).authorization() or ""
    log = workdir / "prometheus.log"
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    with log.open("w") as out:
        proc = subprocess.Popen([prom, f"--config.file={workdir / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                 f"--web.config.file={web_config}"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                req = urllib.request.Request(f"{url}/-/ready", headers={"Authorization": auth})
                with urllib.request.urlopen(req, timeout=1.0, context=ctx) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"secured prometheus did not become ready on {url}:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield Secured(url)
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def secured(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with _secured_prometheus(tmp_path_factory.mktemp("prom-tls"), certs, mutual=False) as s:
        yield s


@pytest.fixture(scope="module")
def mutual(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    with _secured_prometheus(tmp_path_factory.mktemp("prom-mtls"), certs, mutual=True) as s:
        yield s


async def _vector(url: str, auth: PrometheusAuth | None = None) -> float:
    async with PrometheusClient(url, timeout_s=5.0, auth=auth) as client:
        (item,) = await client.query("vector(42)", time.time())
    return float(item["value"][1])


# --- TLS ------------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_untrusted_certificate_is_refused_by_default(secured: Secured) -> None:
    """No CA configured: the system trust store, which does not know the test CA -- refused, never accepted."""
    with pytest.raises(PrometheusError, match="certificate verify failed"):
        await _vector(secured.url, PrometheusAuth(username=USER, password=PASSWORD))
    assert PrometheusAuth().ssl_context() is True  # aiohttp's verifying default, explicitly


@pytest.mark.asyncio
async def test_the_configured_ca_is_verified_and_a_wrong_one_refused(secured: Secured, certs: Certs) -> None:
    assert await _vector(secured.url, PrometheusAuth(ca_file=str(certs.ca), username=USER, password=PASSWORD)) == 42
    with pytest.raises(PrometheusError, match="certificate verify failed"):
        await _vector(secured.url, PrometheusAuth(ca_file=str(certs.other_ca), username=USER, password=PASSWORD))


@pytest.mark.asyncio
async def test_a_callers_session_gets_the_tls_and_the_credentials(secured: Secured, certs: Certs) -> None:
    """The metrics window hands its own aiohttp session to the client: TLS and credentials are per request."""
    auth = PrometheusAuth(ca_file=str(certs.ca), username=USER, password=PASSWORD)
    async with aiohttp.ClientSession() as session:
        client = PrometheusClient(secured.url, timeout_s=5.0, session=session, auth=auth)
        (item,) = await client.query("vector(3)", time.time())
        assert item["value"][1] == "3"
        with pytest.raises(PrometheusError, match="certificate verify failed"):
            await PrometheusClient(secured.url, timeout_s=5.0, session=session).query("vector(3)", time.time())


@pytest.mark.asyncio
async def test_insecure_skip_verify_only_when_written(secured: Secured) -> None:
    assert await _vector(secured.url, PrometheusAuth(insecure_skip_verify=True, username=USER,
                                                     password=PASSWORD)) == 42


@pytest.mark.asyncio
async def test_mutual_tls_sends_the_client_certificate(mutual: Secured, certs: Certs) -> None:
    base = {"ca_file": str(certs.ca), "username": USER, "password": PASSWORD}
    assert await _vector(mutual.url, PrometheusAuth(**base, cert_file=str(certs.client_cert),
                                                    key_file=str(certs.client_key))) == 42
    with pytest.raises(PrometheusError):  # the handshake fails without one
        await _vector(mutual.url, PrometheusAuth(**base))


def test_missing_tls_files_fail_at_construction_with_the_url(tmp_path: Path) -> None:
    with pytest.raises(PrometheusError, match=r"https://prom\.example:9091.*TLS files"):
        PrometheusClient("https://prom.example:9091", auth=PrometheusAuth(ca_file=str(tmp_path / "none.pem")))


# --- basic auth -------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_basic_auth_is_sent_and_its_absence_refused(secured: Secured, certs: Certs, tmp_path: Path) -> None:
    ca = str(certs.ca)
    with pytest.raises(PrometheusError, match="HTTP 401"):
        await _vector(secured.url, PrometheusAuth(ca_file=ca))
    with pytest.raises(PrometheusError, match="HTTP 401"):
        await _vector(secured.url, PrometheusAuth(ca_file=ca, username=USER, password="wrong"))
    pw = tmp_path / "password"
    pw.write_text(PASSWORD + "\n")  # a Secret's trailing newline is not part of the password
    assert await _vector(secured.url, PrometheusAuth(ca_file=ca, username=USER, password_file=str(pw))) == 42


# --- bearer token, rotated --------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def token_gate(prometheus_factory, certs: Certs) -> AsyncIterator[tuple[str, dict]]:
    """An HTTPS gate in front of a plain real Prometheus: 401 unless ``Authorization: Bearer <state['token']>``;
    every Authorization header seen is kept in ``state['seen']``."""
    prom = prometheus_factory(None)
    state: dict = {"token": TOKEN_A, "seen": []}

    async def handle(request: web.Request) -> web.Response:
        got = request.headers.get("Authorization")
        state["seen"].append(got)
        if got != f"Bearer {state['token']}":
            return web.Response(status=401, text="Unauthorized")
        form = await request.post()
        async with aiohttp.ClientSession() as s, s.post(f"{prom.url}{request.path}", data=dict(form)) as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_route("POST", "/api/v1/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}", state
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_bearer_token_file_is_reread_after_rotation(token_gate: tuple[str, dict], certs: Certs,
                                                             tmp_path: Path) -> None:
    url, state = token_gate
    token = tmp_path / "token"
    token.write_text(TOKEN_A)
    auth = PrometheusAuth(ca_file=str(certs.ca), bearer_token_file=str(token))
    async with PrometheusClient(url, timeout_s=5.0, auth=auth) as client:
        (item,) = await client.query("vector(7)", time.time())
        assert item["value"][1] == "7"
        # the issuer rotates: the old token is refused from now on, the file holds the new one
        state["token"] = TOKEN_B
        token.write_text(TOKEN_B + "\n")
        (item,) = await client.query("vector(8)", time.time())
        assert item["value"][1] == "8"
        token.unlink()  # unmounted mid-rotation: a clear error, not a request without credentials
        with pytest.raises(PrometheusError, match="cannot read the credentials"):
            await client.query("vector(9)", time.time())
    assert state["seen"] == [f"Bearer {TOKEN_A}", f"Bearer {TOKEN_B}"]
    assert await _vector(url, PrometheusAuth(ca_file=str(certs.ca), bearer_token=TOKEN_B)) == 42


# --- the settings -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "message"), [
    ({"bearer_token": "a", "bearer_token_file": "/t"}, "exclude each other"),
    ({"bearer_token_file": "/t", "username": "u", "password": "p"}, "exclude each other"),
    ({"username": "u"}, "needs both username and password"),
    ({"password_file": "/p"}, "needs both username and password"),
    ({"cert_file": "/c"}, "go together"),
    ({"insecure_skip_verify": "yes"}, "true or false"),
    ({"insecure_skip_verify": True, "ca_file": "/ca"}, "pointless"),
    ({"ca_file": ""}, "non-empty string"),
    ({"bearer_tokenfile": "/t"}, "unknown key(s) bearer_tokenfile"),
])
def test_settings_are_checked(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PrometheusAuth.from_mapping(data)


def test_credentials_in_the_url_and_the_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="both in the URL and in prometheus_auth"):
        PrometheusClient("https://u:p@prom.example:9091", auth=PrometheusAuth(bearer_token="t"))
    PrometheusClient("https://u:p@prom.example:9091/x@y")  # the URL's own credentials alone: aiohttp sends them


def test_default_settings_verify_and_send_nothing() -> None:
    auth = PrometheusAuth.from_mapping(None)
    assert auth == PrometheusAuth() and auth.insecure_skip_verify is False
    assert auth.authorization() is None and not auth.sends_credentials


# --- slotwise report --prometheus -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_read_report_goes_through_tls_and_basic_auth(secured: Secured, certs: Certs) -> None:
    readings = await read_report(secured.url, 1.0, time.time(), timeout_s=5.0,
                                 auth=PrometheusAuth(ca_file=str(certs.ca), username=USER, password=PASSWORD))
    assert readings.url == secured.url  # every query answered (nothing exported there: empty readings)


def test_report_cli_flags(secured: Secured, certs: Certs, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    base = ["report", "--prometheus", secured.url, "--hours", "1", "--prometheus-username", USER,
            "--prometheus-password-file", str(pw)]
    # reached and answered: nothing of slotwise's is stored there, which the report says (exit 2, one line)
    reached = "has no slotwise cost or request series"
    assert slotwise([*base, "--prometheus-ca-file", str(certs.ca)]) == 2
    assert reached in capsys.readouterr().err
    assert slotwise([*base, "--prometheus-insecure-skip-verify"]) == 2
    assert reached in capsys.readouterr().err
    # no CA given: the system store does not trust the test CA -- refused before any query
    assert slotwise(base) == 2
    err = capsys.readouterr().err
    assert "certificate verify failed" in err and reached not in err and len(err.strip().splitlines()) == 1, err
    # without the password Prometheus refuses
    assert slotwise(["report", "--prometheus", secured.url, "--prometheus-ca-file", str(certs.ca)]) == 2
    assert "HTTP 401" in capsys.readouterr().err
