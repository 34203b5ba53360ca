"""The one Prometheus client: instant and range queries over Prometheus' HTTP API, async, on aiohttp.

Every caller goes through :class:`PrometheusClient` -- the per-tick metrics window
(:mod:`~autoscaler.live.prometheus.metrics`), the forecaster's warm start
(:mod:`~autoscaler.live.prometheus.history`) and ``slotwise report --prometheus``
(:mod:`~autoscaler.live.prometheus.report`); the PromQL they send is built in
:mod:`~autoscaler.live.prometheus.promql`.

- Queries are POSTed form-encoded (Prometheus accepts it since 2.1): long expressions never hit URL limits.
- Every failure -- connection refused or timed out, an HTTP error, a PromQL error, an answer that is not
  Prometheus' JSON -- raises :class:`PrometheusError`, whose message names the URL (and, for a refused
  query, the query) and says why, on one line.
- ``timeout_s`` bounds each HTTP request (each chunk of a chunked range query).
- TLS and authentication (:class:`PrometheusAuth`, the settings' ``prometheus_auth:``): an ``https://`` URL's
  certificate is ALWAYS verified -- against the system's trust store, or ``ca_file`` -- unless the operator
  writes ``insecure_skip_verify: true``; a bearer token (``bearer_token`` or ``bearer_token_file``) or HTTP basic
  auth (``username`` with ``password`` or ``password_file``) is sent on every request. Files are read on every
  request, as Prometheus itself reads its ``credentials_file``: a rotated token (a projected ServiceAccount
  token, a Secret update) is used from the next query on, without a restart. TLS and credentials are applied
  per request, so a session given by the caller gets them too.
- Prometheus refuses a range query of more than 11,000 points per series, so :meth:`PrometheusClient.query_range`
  splits a longer range into chunks of at most ``max_points`` evaluation times and merges the answers per
  series (label set). Start, end and step are sent as exact decimal seconds: Prometheus evaluates at
  ``start + k * step`` in whole milliseconds, so the chunks land on the same grid as one query would.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

log = logging.getLogger(__name__)

# Prometheus' limit on points per series in one range query (promql: "exceeded maximum resolution of 11,000
# points per timeseries").
MAX_POINTS = 11_000


class PrometheusError(OSError):
    """A query failed (connection, HTTP, PromQL or an unreadable answer); the message says which and why.
    ``url``: the Prometheus asked; ``query``: the PromQL, when the failure is the query's. An ``OSError`` (as
    ``requests``' errors are): a failed exchange with another system, which the CLI prints as one line."""

    def __init__(self, message: str, *, url: str, query: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.query = query


@dataclass(frozen=True)
class PrometheusAuth:
    """How to reach a Prometheus behind TLS and authentication (the settings' ``prometheus_auth:``; every field
    optional, the default is plain verification and no credentials).

    ``ca_file``: PEM bundle the server certificate must chain to (default: the system trust store);
    ``insecure_skip_verify``: accept any certificate (an explicit opt-out, never the default); ``cert_file`` +
    ``key_file``: a client certificate (mutual TLS). ``bearer_token`` or ``bearer_token_file`` (e.g.
    ``/var/run/secrets/kubernetes.io/serviceaccount/token`` behind kube-rbac-proxy): ``Authorization: Bearer``;
    ``username`` with ``password`` or ``password_file``: HTTP basic auth. A token and basic auth exclude each
    other (one ``Authorization`` header), as do a value and its file. Files are read on every request (rotation).
    """

    ca_file: str | None = None
    insecure_skip_verify: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    username: str | None = None
    password: str | None = None
    password_file: str | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "insecure_skip_verify":
                if not isinstance(value, bool):
                    raise ValueError(f"prometheus_auth: insecure_skip_verify must be true or false, got {value!r}")
            elif value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"prometheus_auth: {f.name} must be a non-empty string, got {value!r}")
        pairs = (("bearer_token", "bearer_token_file"), ("password", "password_file"))
        for a, b in pairs:
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise ValueError(f"prometheus_auth: {a} and {b} exclude each other")
        token = self.bearer_token is not None or self.bearer_token_file is not None
        password = self.password is not None or self.password_file is not None
        if token and (self.username is not None or password):
            raise ValueError("prometheus_auth: a bearer token and basic auth exclude each other (one Authorization)")
        if password != (self.username is not None):
            raise ValueError("prometheus_auth: basic auth needs both username and password (or password_file)")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("prometheus_auth: cert_file and key_file go together (mutual TLS)")
        if self.insecure_skip_verify and self.ca_file is not None:
            raise ValueError("prometheus_auth: ca_file is pointless with insecure_skip_verify: true")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> PrometheusAuth:
        """The ``prometheus_auth:`` mapping of a settings file; unknown keys are errors."""
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(data) - known)
        if bad:
            raise ValueError(f"prometheus_auth: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    @property
    def sends_credentials(self) -> bool:
        return any(v is not None for v in (self.bearer_token, self.bearer_token_file, self.username))

    def ssl_context(self) -> ssl.SSLContext | bool:
        """What aiohttp's ``ssl=`` gets: ``True`` (verify against the system store) unless a CA, a client
        certificate or the explicit skip is configured. Files are read here (once per client)."""
        if self.insecure_skip_verify:
            if self.cert_file is None:
                return False
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_file is None and self.cert_file is None:
            return True
        else:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def authorization(self) -> str | None:
        """The ``Authorization`` header value for the next request (files read now), or None."""
        if self.bearer_token is not None or self.bearer_token_file is not None:
            token = self.bearer_token if self.bearer_token is not None else _read_secret(self.bearer_token_file)
            return f"Bearer {token}"
        if self.username is not None:
            password = self.password if self.password is not None else _read_secret(self.password_file)
            raw = f"{self.username}:{password}".encode()
            return "Basic " + base64.b64encode(raw).decode("ascii")
        return None


def _read_secret(path: str | None) -> str:
    """A credential file's content without the trailing newline a Secret or ``echo`` often leaves."""
    assert path is not None
    return Path(path).read_text().strip()


def on_grid(values: Sequence[Any], start: float, step_s: float, n: int) -> np.ndarray:
    """A range answer's ``[[ts, "value"], ...]`` as a float array on the grid ``start + i * step_s``
    (``i < n``), NaN where Prometheus had no sample. Values are parsed as Prometheus writes them ("4",
    "NaN", "+Inf"): a non-finite value stays as it is."""
    out = np.full(n, np.nan)
    for ts, v in values:
        i = round((float(ts) - start) / step_s)
        if 0 <= i < n:
            out[i] = float(v)
    return out


class PrometheusClient:
    """An async client of one Prometheus (``url``). ``session``: an aiohttp session to use (not closed here);
    without one a session is created on first use and closed by :meth:`close` (or ``async with``). ``auth``:
    TLS verification and credentials (:class:`PrometheusAuth`; default: verify, no credentials), applied to
    every request whichever session carries it."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, session: aiohttp.ClientSession | None = None,
                 auth: PrometheusAuth | None = None) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be positive seconds, got {timeout_s!r}")
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._own_session = session is None
        self.auth = auth or PrometheusAuth()
        try:
            self._ssl = self.auth.ssl_context()
        except (OSError, ssl.SSLError) as exc:  # a missing or unreadable CA / client certificate
            raise PrometheusError(f"Prometheus {self.url}: cannot load the TLS files: {exc}", url=self.url) from exc
        if self.auth.sends_credentials and "@" in self.url.split("://", 1)[-1].split("/", 1)[0]:
            raise ValueError(f"Prometheus {self.url}: credentials both in the URL and in prometheus_auth; keep one")
        if self.auth.sends_credentials and not self.url.lower().startswith("https://"):
            log.warning("Prometheus %s: credentials are sent over plain HTTP; use an https:// URL", self.url)

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def close(self) -> None:
        if self._own_session and self._session is not None and not self._session.closed:
            await self._session.close()
        if self._own_session:
            self._session = None

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if not self._own_session:
                raise PrometheusError("the aiohttp session given to the Prometheus client is closed", url=self.url)
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    # -- queries ------------------------------------------------------------------------------------------
    async def _api(self, path: str, form: dict[str, str]) -> list[dict]:
        endpoint = f"{self.url}{path}"
        query = form.get("query")
        http = self._http()
        try:
            authorization = self.auth.authorization()
        except OSError as exc:  # the token / password file is missing or unreadable (mid-rotation, unmounted)
            raise PrometheusError(f"Prometheus {self.url}: cannot read the credentials: {exc}", url=self.url) from exc
        headers = {"Authorization": authorization} if authorization is not None else None
        try:
            async with http.post(endpoint, data=form, timeout=self.timeout, headers=headers, ssl=self._ssl) as resp:
                text = await resp.text()
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    body = None
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise PrometheusError(
                f"cannot reach Prometheus at {self.url}: {type(exc).__name__}: {exc}".rstrip(": "), url=self.url
            ) from exc
        if not isinstance(body, dict):
            raise PrometheusError(f"HTTP {status} from {endpoint}, not a Prometheus answer: {text[:200]!r}",
                                  url=self.url, query=query)
        if body.get("status") != "success" or status != 200:
            raise PrometheusError(
                f"HTTP {status} from {endpoint}: {body.get('errorType', 'error')}: {body.get('error', text[:200])}"
                f" (query {query!r})",
                url=self.url, query=query,
            )
        data = body.get("data") or {}
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise PrometheusError(f"no result list in the answer to {query!r}", url=self.url, query=query)
        return result

    async def query(self, promql: str, time: float) -> list[dict]:
        """``/api/v1/query`` at ``time`` (Unix seconds): the ``result`` list, ``[{metric, value}, ...]``."""
        return await self._api("/api/v1/query", {"query": promql, "time": repr(float(time))})

    async def query_range(
        self, promql: str, start: float, end: float, step_s: float, *, max_points: int = MAX_POINTS
    ) -> list[dict]:
        """``/api/v1/query_range`` evaluated at ``start, start + step_s, ...`` up to ``end``: the ``result``
        list, ``[{metric, values}, ...]``. More than ``max_points`` evaluation times are asked in chunks
        (one after the other) and each series' values concatenated, oldest first."""
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s must be positive, got {step_s!r}")
        n = math.floor((end - start) / step_s + 1e-9) + 1
        per = max(1, int(max_points))
        if n <= per:
            return await self._range(promql, start, end, step_s)
        merged: dict[tuple[tuple[str, str], ...], dict] = {}
        for c0 in range(0, n, per):
            c1 = min(c0 + per, n) - 1
            # the chunk's end half a step past its last point: float noise never drops that point, and the
            # next grid time is not evaluated (Prometheus stops at the last start + k * step <= end)
            for series in await self._range(promql, start + c0 * step_s, start + (c1 + 0.5) * step_s, step_s):
                labels = series.get("metric") or {}
                one = merged.setdefault(tuple(sorted(labels.items())), {"metric": labels, "values": []})
                one["values"].extend(series.get("values") or ())
        return list(merged.values())

    async def _range(self, promql: str, start: float, end: float, step_s: float) -> list[dict]:
        form = {"query": promql, "start": repr(float(start)), "end": repr(float(end)), "step": repr(float(step_s))}
        return await self._api("/api/v1/query_range", form)
