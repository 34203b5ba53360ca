"""The activation book: what the activators say they hold, and the wake-up of the tick loop (issue 18).

Each activator replica POSTs ``/v1/activations`` to every controller replica (the contract in
docs/scale-to-zero.md) on its first held request for a model and every second while it holds any::

    {"activator": "<pod name>", "models": [{"namespace": ns, "service": svc, "model": "<workload name>",
                                           "held": n, "oldest_wait_s": s}]}

:meth:`ActivationBook.report` records the counts per (activator, model) and, when a report holds requests for a
model the book is told has no active replica (none placed and not draining), or for a model new to the book, sets
:attr:`ActivationBook.wake` -- the event the leader's tick loop waits on with its tick timeout, so a scale from
zero is planned at once, not at the next tick. A model whose replica is starting (a cold start of minutes) has
nothing a tick could do sooner, so the reports that come every second from every activator meanwhile wake
nothing; and wakes are at most one per ``min_wake_interval_s`` whatever comes (a burst of reports is one tick).
A wake refused by that limit is not lost for a model still without an active replica: its activators report
again within a second. A count expires
``ttl_s`` after its activator's last report (an activator that died, or stopped holding, stops counting).
:meth:`held` sums them per model key (``"<namespace>/<workload name>"``): the controller merges that into the
metrics window as ``ModelMetrics.held_requests``.

Every replica books reports, the leader alone acts on them; a follower that becomes leader has the counts already.

Who may report (:class:`ReportAuth`): the activator sends its ServiceAccount token (the chart projects one with
audience ``slotwise.io/activations``) as a bearer token; the controller has the apiserver review it (TokenReview,
cached briefly) and takes the report only if it is the activator ServiceAccount's, and -- the second check -- its
pod (a projected token names it) is an activator pod the controller's informer knows (a token not bound to a pod:
the sender's IP must be an activator pod's). A source IP alone is no credential: a mesh sidecar or SNAT hides the
activator's, and a pod that gets a dead activator's IP would pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_TTL_S = 5.0  # a held count lives this long after its activator's last report (reports come every second)
MIN_WAKE_INTERVAL_S = 1.0  # at most one wake of the tick loop per this long (activators report every second)


class ActivationError(ValueError):
    """A report that is not the contract's JSON (the HTTP answer is 400 with this message)."""


@dataclass(frozen=True)
class Held:
    """One activator's last word about one model."""

    held: int
    oldest_wait_s: float
    at: float  # when it was reported (the book's clock)


def parse_report(body: Any) -> tuple[str, list[tuple[str, int, float]]]:
    """The contract's JSON -> (activator, [(model key, held, oldest_wait_s)]). Raises :class:`ActivationError`
    naming what is wrong."""
    if not isinstance(body, Mapping):
        raise ActivationError("expected a JSON object with 'activator' and 'models'")
    activator = body.get("activator")
    if not isinstance(activator, str) or not activator:
        raise ActivationError("'activator' must be a non-empty string (the activator's pod name)")
    models = body.get("models")
    if not isinstance(models, list):
        raise ActivationError("'models' must be a list")
    out = []
    for i, m in enumerate(models):
        if not isinstance(m, Mapping):
            raise ActivationError(f"models[{i}]: expected an object")
        ns, model = m.get("namespace"), m.get("model")
        if not isinstance(ns, str) or not ns or not isinstance(model, str) or not model:
            raise ActivationError(f"models[{i}]: 'namespace' and 'model' must be non-empty strings")
        held, wait = m.get("held"), m.get("oldest_wait_s", 0.0)
        if isinstance(held, bool) or not isinstance(held, (int, float)) or not math.isfinite(held) or held < 0:
            raise ActivationError(f"models[{i}]: 'held' must be a count >= 0, got {held!r}")
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
            raise ActivationError(f"models[{i}]: 'oldest_wait_s' must be seconds >= 0, got {wait!r}")
        out.append((f"{ns}/{model}", int(held), float(wait)))
    return activator, out


class ActivationBook:
    """Held counts per (activator, model), expiring; ``wake`` set by a report that needs a scale from zero.

    ``active(model)`` says whether a model has an active replica now (placed and not draining: Ready or still
    starting; the controller answers from its last view: a model it does not know counts as without one, so a
    report never waits on a tick that could not know it)."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, *, clock: Callable[[], float] = time.monotonic,
                 min_wake_interval_s: float = MIN_WAKE_INTERVAL_S) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.min_wake_interval_s = min_wake_interval_s
        self.wake = asyncio.Event()
        self.active: Callable[[str], bool] = lambda _model: False
        self._held: dict[tuple[str, str], Held] = {}
        self._woke_at: float | None = None
        self.reports = 0
        self.wakes = 0

    def report(self, body: Any) -> bool:
        """Book one report (the parsed JSON); True when it woke the loop. Raises :class:`ActivationError`."""
        activator, models = parse_report(body)
        now = self.clock()
        self.reports += 1
        # models any activator holds requests for now, before this report (the expired ones do not count)
        known = {m for (_, m), h in self._held.items() if now - h.at <= self.ttl_s}
        # the activator's report replaces its earlier one: a model it no longer lists holds nothing there
        for k in [k for k in self._held if k[0] == activator]:
            del self._held[k]
        wants = False
        for model, held, wait in models:
            if held > 0:
                self._held[(activator, model)] = Held(held, wait, now)
                if model not in known or not self.active(model):
                    wants = True
        if not wants or (self._woke_at is not None and now - self._woke_at < self.min_wake_interval_s):
            return False
        self._woke_at = now
        self.wakes += 1
        self.wake.set()
        return True

    def held(self) -> dict[str, float]:
        """Model key -> requests held for it now, summed over the activators whose report has not expired."""
        now = self.clock()
        for k in [k for k, h in self._held.items() if now - h.at > self.ttl_s]:
            del self._held[k]
        out: dict[str, float] = {}
        for (_, model), h in self._held.items():
            out[model] = out.get(model, 0.0) + h.held
        return out


# --- who may report: the activator's ServiceAccount token (TokenReview) ----------------------------------------

ACTIVATION_AUDIENCE = "slotwise.io/activations"  # the audience of the activator's projected token (the chart's)
REVIEW_TTL_S = 30.0  # a token the apiserver authenticated is trusted this long without asking again
REFUSED_REVIEW_TTL_S = 5.0  # a refused token is refused this long without asking (a flood costs no TokenReviews)
REVIEW_TIMEOUT_S = 5.0  # a TokenReview that hangs must not hold the report's handler (the activator retries in 1 s)
REVIEW_CACHE_MAX = 1024  # tokens remembered at most (the activators have a handful; the rest are strangers)
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"  # in a pod-bound (projected) token's user info
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"

# The reasons a report is refused (the ``reason`` label of slotwise_activation_reports_refused_total).
NO_TOKEN, BAD_TOKEN, NOT_THE_ACTIVATOR, NOT_AN_ACTIVATOR_POD, NOT_THE_SENDER, REVIEW_FAILED = (
    "no-token", "invalid-token", "wrong-service-account", "not-an-activator-pod", "not-the-sender",
    "review-failed")


class Refused(Exception):
    """A report that is not let in: ``status`` 401 (no or an invalid token), 403 (a valid token, but not the
    activator's, or of a pod that is not an activator pod) or 503 (the apiserver could not be asked);
    ``reason`` one of the constants above."""

    def __init__(self, status: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.status, self.reason, self.text = status, reason, text


@dataclass(frozen=True)
class Reviewed:
    """What a TokenReview said of a token: authenticated or not (``error``), as whom, for which audiences, and
    the pod a pod-bound token was issued to (None: a token not bound to a pod, e.g. a legacy Secret's)."""

    authenticated: bool
    user: str = ""
    audiences: tuple[str, ...] = ()
    pod: str | None = None
    pod_uid: str | None = None
    error: str = ""


def _ip(address: str) -> str:
    """One spelling of an address (an IPv4 peer on a dual-stack socket, ``::ffff:a.b.c.d``, is ``a.b.c.d``)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return str(getattr(ip, "ipv4_mapped", None) or ip)


def service_account_user(namespace: str, name: str) -> str:
    """The username the apiserver gives a ServiceAccount's tokens."""
    return f"system:serviceaccount:{namespace}:{name}"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: absent, another scheme, or empty)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_review(audience: str | None, token: str) -> dict[str, Any]:
    """The TokenReview to create for ``token`` (with ``audience``: the apiserver authenticates it only if the
    token was issued for it -- a token for another audience, e.g. the default one, is not an activation token)."""
    spec: dict[str, Any] = {"token": token}
    if audience:
        spec["audiences"] = [audience]
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def reviewed(status: Mapping[str, Any] | None) -> Reviewed:
    """A TokenReview's ``status`` as :class:`Reviewed` (pure)."""
    status = status or {}
    user = status.get("user") or {}
    extra = user.get("extra") or {}

    def first(key: str) -> str | None:
        values = extra.get(key) or ()
        return str(values[0]) if values else None

    return Reviewed(bool(status.get("authenticated")), str(user.get("username") or ""),
                    tuple(str(a) for a in status.get("audiences") or ()), first(POD_NAME_EXTRA),
                    first(POD_UID_EXTRA), str(status.get("error") or ""))


def judge(r: Reviewed, *, user: str, audience: str | None, pods: Iterable[Mapping[str, Any]],
          peer: str, peer_ips: Callable[[Mapping[str, Any]], Iterable[str]]) -> Refused | None:
    """Whether a reviewed token may report (None) or why not (pure). The token must be authenticated, for
    ``audience`` (when one is asked for), as ``user`` (the activator's ServiceAccount). The second check is the
    pod: a pod-bound token's pod must be one of the activator ``pods`` (by name, and uid when both say one: a pod
    recreated under the same name has another); a token not bound to a pod (a legacy Secret's, which every pod of
    that ServiceAccount shares) is taken only from the IP of an activator pod, the check before tokens."""
    if not r.authenticated:
        return Refused(401, BAD_TOKEN, f"activation report refused: invalid token ({r.error or 'not authenticated'})")
    if audience and audience not in r.audiences:
        return Refused(401, BAD_TOKEN, f"activation report refused: the token is not for audience {audience}")
    if r.user != user:
        return Refused(403, NOT_THE_ACTIVATOR, f"activation report refused: {r.user} is not {user}")
    pods = list(pods)
    if r.pod is not None:
        meta = [p.get("metadata") or {} for p in pods]
        if not any(m.get("name") == r.pod and (r.pod_uid is None or m.get("uid") in (None, r.pod_uid))
                   for m in meta):
            return Refused(403, NOT_AN_ACTIVATOR_POD,
                           f"activation report refused: the token's pod {r.pod} is not an activator pod")
        return None
    if _ip(peer) not in {_ip(ip) for p in pods for ip in peer_ips(p)}:
        return Refused(403, NOT_AN_ACTIVATOR_POD, f"activation report refused: a token not bound to a pod, from "
                                                  f"{peer}, which is not an activator pod's IP")
    return None


Review = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any] | None]]  # TokenReview body -> its status


class ReportAuth:
    """Authenticates the activation reports: the bearer token by a TokenReview (``review``: create one, answer its
    status), cached -- a positive answer ``REVIEW_TTL_S``, a refusal ``REFUSED_REVIEW_TTL_S`` (by the token's hash,
    never the token) --, then :func:`judge` against the activator ``pods`` the controller's informer holds, every
    time (a pod gone is refused at once, whatever the cache says). ``refused`` counts refusals by reason."""

    def __init__(self, review: Review, user: str, pods: Callable[[], Iterable[Mapping[str, Any]]], *,
                 audience: str | None = ACTIVATION_AUDIENCE,
                 peer_ips: Callable[[Mapping[str, Any]], Iterable[str]] = lambda _p: (),
                 clock: Callable[[], float] = time.monotonic, on_refused: Callable[[str], None] = lambda _r: None,
                 ttl_s: float = REVIEW_TTL_S, refused_ttl_s: float = REFUSED_REVIEW_TTL_S) -> None:
        self.review, self.user, self.pods, self.audience = review, user, pods, audience or None
        self.peer_ips, self.clock, self.on_refused = peer_ips, clock, on_refused
        self.ttl_s, self.refused_ttl_s = ttl_s, refused_ttl_s
        self._cache: dict[str, tuple[float, Reviewed]] = {}
        self.reviews = 0  # TokenReviews made
        self.refused: dict[str, int] = {}

    async def check(self, authorization: str | None, peer: str) -> Reviewed:
        """The reviewed token of a report that may be booked; raises :class:`Refused` (counted) otherwise."""
        try:
            token = bearer_token(authorization)
            if token is None:
                raise Refused(401, NO_TOKEN, "activation report refused: no bearer token (the activator sends its "
                                             "ServiceAccount token: --token-file)")
            r = await self._reviewed(token)
            refusal = judge(r, user=self.user, audience=self.audience, pods=self.pods(), peer=peer,
                            peer_ips=self.peer_ips)
            if refusal is not None:
                raise refusal
            return r
        except Refused as e:
            self.count(e.reason)
            raise

    def count(self, reason: str) -> None:
        """One more report refused for ``reason``."""
        self.refused[reason] = self.refused.get(reason, 0) + 1
        self.on_refused(reason)

    async def _reviewed(self, token: str) -> Reviewed:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and now < hit[0]:
            return hit[1]
        self.reviews += 1
        try:
            r = reviewed(await self.review(token_review(self.audience, token)))
        except Exception as e:  # the apiserver could not answer: refuse now (the activator reports again in 1 s)
            raise Refused(503, REVIEW_FAILED, f"activation report not checked: TokenReview failed ({e})") from None
        if len(self._cache) >= REVIEW_CACHE_MAX:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= REVIEW_CACHE_MAX:
                self._cache.clear()
        self._cache[key] = (now + (self.ttl_s if r.authenticated else self.refused_ttl_s), r)
        return r


def refused_counter(registry: Any) -> Any:
    """``slotwise_activation_reports_refused_total{reason}`` in the controller's registry."""
    from prometheus_client import Counter

    return Counter("slotwise_activation_reports_refused", "Activation reports refused, by reason (no-token, "
                   "invalid-token: 401; wrong-service-account, not-an-activator-pod, not-the-sender: 403; "
                   "review-failed: 503).", ["reason"], registry=registry)


def kube_token_review(api_client: Any) -> Review:
    """``review`` for :class:`ReportAuth`: ``POST authentication.k8s.io/v1 tokenreviews`` on ``api_client``."""
    from kubernetes_asyncio.client import AuthenticationV1Api

    api = AuthenticationV1Api(api_client)

    async def review(body: dict[str, Any]) -> Mapping[str, Any] | None:
        async with asyncio.timeout(REVIEW_TIMEOUT_S):
            got = await api.create_token_review(body)
        return api_client.sanitize_for_serialization(got).get("status")

    return review
