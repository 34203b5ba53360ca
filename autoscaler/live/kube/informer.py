"""A list+watch cache of one Kubernetes collection (any resource path), as plain JSON dicts.

The controller observes the cluster through a handful of these (Deployments, Pods, Nodes, Jobs, Kueue
Workloads): each keeps an in-memory copy of the objects under one collection path, so a tick reads the cache
instead of the apiserver. It is the informer/reflector pattern of client-go, over kubernetes_asyncio's
``ApiClient`` but without its generated models (objects stay camelCase dicts, exactly as served):

* **list** the collection in pages (``limit``/``continue``) and replace the cache atomically when the last
  page is in (objects that vanished since the previous list are dropped and reported as ``DELETED``);
* **watch** from the list's ``resourceVersion`` with ``allowWatchBookmarks=true`` and ``timeoutSeconds``;
  ``BOOKMARK`` events only advance the resourceVersion; a watch the server ends is reopened from the last one;
* **410 Gone** (HTTP 410, a watch ``ERROR`` event with code 410, or "too old resource version"): the
  resourceVersion is compacted away and events were lost, so re-list, then tell subscribers ``RELIST``;
* any other failure (HTTP errors, dropped connections, undecodable lines) -> reconnect after a full-jitter
  exponential backoff (``backoff_initial_s`` doubling up to ``backoff_max_s``), reset by a successful list or
  watch event, so a flapping apiserver is not hammered by every replica in lock-step;
* ``transform`` (optional): applied to every listed or watched object before it is cached or handed to
  subscribers, so a cache keeps only what its readers need (the pods informer:
  :func:`~autoscaler.live.kube.pods.slim_pod`);
* ``keep`` (optional): a predicate on the transformed object; what it refuses is not cached at all (a listed
  object is skipped, a watched one that stops qualifying leaves the cache as ``DELETED``), for collections where
  the API has no selector for what matters (the pods informer in namespace mode:
  :class:`~autoscaler.live.kube.pods.PodScope`). Dropped objects still advance the resourceVersion and are contact.
  :meth:`Informer.request_relist` ends the watch and lists again (what ``keep`` refused may qualify now);
  ``after``: informers whose first sync this one waits for before its first list (what ``keep`` reads);
* ``optional=True`` (a CRD that may not be installed, e.g. Kueue Workloads): a 404 means "synced and empty",
  and the path is probed again every ``backoff_max_s``.

**Freshness.** ``synced`` stays True forever, so it cannot tell a cache that is current from one whose watch
stopped delivering (a partitioned apiserver, a stuck proxy, watches failing over and over): the cache keeps
serving what it had. :meth:`Informer.last_contact_age` is how long ago the server last confirmed the cache: a
complete list, any watch event (a ``BOOKMARK`` too), or a watch stream the server ended cleanly. A healthy watch
makes contact at least every ``watch_timeout_s`` (the server sends a ``BOOKMARK`` shortly before it closes the watch
at ``timeoutSeconds``, and the clean end is contact too; it is reopened at once), so :meth:`Informer.frozen` -- no
contact for longer than ``watch_timeout_s + contact_grace_s`` -- means the cache may be missing changes; the
controller holds its decisions while any informer is frozen (:func:`frozen_informers`). An HTTP error, a dropped or
hung connection, or a held watch is no contact.

The watches are short on purpose (:data:`DEFAULT_WATCH_TIMEOUT_S`, 15 s, and as much grace: frozen after 30 s
without contact, :data:`DEFAULT_FREEZE_AFTER_S`): a watch that stays open but delivers nothing (a stuck proxy, a
half-open connection, an apiserver that stopped feeding it) looks exactly like a quiet collection until the server
should have ended it, so the watch timeout IS the liveness check -- a BOOKMARK or the clean end within it proves the
stream alive, on an idle cluster too. Each reopen resumes from the last resourceVersion (the apiserver's watch
cache answers it without touching etcd; the BOOKMARK just before the end keeps that resourceVersion recent, so
reopens do not turn into 410s and re-lists). The price is one watch request per informer every 15 s. A stream that
is silent past the bound is abandoned (its read timeout) and reopened, so a stall ends by itself.

Cancelling :meth:`Informer.run` closes the open response; the cache stays readable afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from autoscaler.live.kube.objects import object_key

log = logging.getLogger(__name__)

# A healthy watch makes contact at least this often (module docstring, "Freshness"); the grace defaults to as much,
# so a cache is frozen after DEFAULT_FREEZE_AFTER_S without contact.
DEFAULT_WATCH_TIMEOUT_S = 15
DEFAULT_FREEZE_AFTER_S = 2.0 * DEFAULT_WATCH_TIMEOUT_S


def liveness(freeze_after_s: float) -> dict[str, Any]:
    """The informer parameters for a cache frozen after ``freeze_after_s`` without contact: half of it the watch's
    timeoutSeconds (whole seconds, at least 1), the rest the grace (the controller's ``cache_freeze_after_s``)."""
    if not (math.isfinite(freeze_after_s) and freeze_after_s >= 1.0):
        raise ValueError(f"a freeze bound must be at least 1 s, got {freeze_after_s!r}")
    watch = max(1, int(freeze_after_s / 2))
    return {"watch_timeout_s": watch, "contact_grace_s": float(freeze_after_s - watch)}

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"
ERROR = "ERROR"
RELIST = "RELIST"  # the cache was replaced by a re-list (after the per-object ADDED/MODIFIED/DELETED diff)

Callback = Callable[[str, dict[str, Any]], None]


class Backoff:
    """Full-jitter exponential backoff: the n-th delay (from 0) is uniform in ``[0, min(max_s, initial_s * 2**n)]``.

    Full jitter (rather than a fixed doubling) spreads reconnects of many clients that failed together, which
    is what an apiserver restart looks like to a fleet of informers.
    """

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def ceiling(self) -> float:
        """The upper bound of the next delay."""
        # cap the exponent: 2**attempt overflows float long after the ceiling has hit max_s anyway
        return min(self.max_s, self.initial_s * 2 ** min(self.attempt, 64))

    def next(self) -> float:
        delay = self._rng.uniform(0.0, self.ceiling())
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class InformerStats:
    lists: int = 0  # complete (all pages) successful lists
    relists: int = 0  # successful lists after the first one (410 Gone, or an optional path that appeared)
    watches: int = 0  # watch streams opened (HTTP 200)
    watch_restarts: int = 0  # watch streams that ended for any reason (server timeout, drop, error, 410) or failed
    events: int = 0  # ADDED/MODIFIED/DELETED events applied
    bookmarks: int = 0
    gone: int = 0  # 410s seen (each leads to a re-list)
    not_found: int = 0  # 404s of an optional path
    errors: int = 0  # failures that led to a backoff (HTTP errors, network errors, bad lines, ERROR events)
    dropped: int = 0  # listed or watched objects ``keep`` refused (not cached)
    last_error: str | None = None


class _Gone(Exception):
    """The resourceVersion (or list continuation) is too old: only a fresh list can resume."""


class _NotFound(Exception):
    """The collection path answered 404 (an optional CRD that is not, or no longer, installed)."""


class _Relist(Exception):
    """A re-list was asked for (:meth:`Informer.request_relist`): the watch is ended, the collection listed."""


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _status_message(status: int, body: str) -> str:
    """The ``message`` of a ``Status`` body if it is one, else the body's start."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:300]
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return f"{parsed.get('reason')}: {parsed.get('message')}"
    return body[:300]


def _is_gone(status: int, message: str) -> bool:
    # older apiservers (and etcd compaction races) report an expired resourceVersion as a 500 whose message says so
    return status == 410 or "too old resource version" in message.lower()


def _rv(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


class Informer:
    """A list+watch cache of the collection at ``path`` (e.g. ``/api/v1/pods``, ``/apis/apps/v1/deployments``,
    ``/api/v1/namespaces/ns/configmaps``); see the module docstring for the protocol.

    Read with :meth:`items` / :meth:`get` (the cached dicts themselves: treat them as read-only) once
    :attr:`synced`; :meth:`subscribe` to hear about changes. Callbacks run synchronously in the informer's task
    and must not block; an exception in one is logged and ignored.
    """

    def __init__(
        self,
        api_client: Any,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        name: str | None = None,
        optional: bool = False,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        rng: random.Random | None = None,
        page_size: int = 500,
        request_timeout_s: float = 60.0,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        contact_grace_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        keep: Callable[[dict[str, Any]], bool] | None = None,
        after: Callable[[], Iterable[Informer]] | None = None,
    ) -> None:
        self._api = api_client
        self.path = "/" + path.strip("/")
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.name = name or (self.path + (f"?labelSelector={label_selector}" if label_selector else ""))
        self.optional = optional
        self.backoff_max_s = backoff_max_s
        self.watch_timeout_s = int(watch_timeout_s)
        self.page_size = int(page_size)
        self.request_timeout_s = request_timeout_s
        # applied to every object (listed or watched) before it is cached or handed to subscribers, so a cache
        # can drop what no reader needs (the pods informer: env, volumes, managedFields; see pods.slim_pod)
        self.transform = transform
        self.keep = keep  # what is cached at all (module docstring)
        self._after = after  # informers to wait for before the first list (what keep reads)
        self._relist_wanted = asyncio.Event()
        # How much longer than a watch's timeoutSeconds a healthy informer may go without contact: the reconnect,
        # and the pause after a watch that ended early and empty (capped at half the grace, see run()), with room to
        # spare. As long as a watch by default: frozen after two watch timeouts without contact.
        self.contact_grace_s = float(self.watch_timeout_s if contact_grace_s is None else contact_grace_s)
        if self.contact_grace_s < 0:
            raise ValueError(f"contact_grace_s must be >= 0, got {contact_grace_s}")
        if self.watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s must be at least 1 s, got {watch_timeout_s}")
        self._clock = clock
        self._last_contact: float | None = None
        self.stats = InformerStats()
        self._backoff = Backoff(backoff_initial_s, backoff_max_s, rng)
        self._cache: dict[str, dict[str, Any]] = {}
        self._resource_version: str | None = None
        self._synced = asyncio.Event()
        self._subscribers: list[Callback] = []
        self._listed_once = False
        self._events_since_list = 0

    # --- reading --------------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first list completed (or an optional path answered 404); stays True afterwards."""
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the next watch resumes from (the last list's, advanced by events and bookmarks)."""
        return self._resource_version

    @property
    def last_contact(self) -> float | None:
        """When (on the informer's clock, monotonic by default) the server last confirmed the cache; None: never."""
        return self._last_contact

    def last_contact_age(self, now: float | None = None) -> float:
        """Seconds since the server last confirmed the cache (a list, a watch event or bookmark, a watch the
        server ended cleanly); ``math.inf`` before the first. ``now`` on the informer's clock (default: read it)."""
        if self._last_contact is None:
            return math.inf
        return max(0.0, (self._clock() if now is None else now) - self._last_contact)

    @property
    def freeze_after_s(self) -> float:
        """No contact for longer than this and the cache is :meth:`frozen`: ``watch_timeout_s + contact_grace_s``."""
        return self.watch_timeout_s + self.contact_grace_s

    def frozen(self, now: float | None = None) -> bool:
        """The cache may be missing changes: no contact with the server for longer than :attr:`freeze_after_s`
        (or never). A healthy watch makes contact at least every ``watch_timeout_s``."""
        return self.last_contact_age(now) > self.freeze_after_s

    def _touch(self) -> None:
        self._last_contact = self._clock()

    async def wait_synced(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._synced.wait(), timeout)
        return self._synced.is_set()

    def items(self) -> list[dict[str, Any]]:
        return list(self._cache.values())

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached object with ``objects.object_key(obj) == key`` (``ns/name``, or ``name`` if cluster-scoped)."""
        return self._cache.get(key)

    def __len__(self) -> int:
        return len(self._cache)

    def subscribe(self, callback: Callback) -> None:
        """``callback(event_type, obj)`` with ADDED/MODIFIED/DELETED and the object, or RELIST and
        ``{"metadata": {"resourceVersion": rv}, "count": n}`` after a re-list replaced the cache."""
        self._subscribers.append(callback)

    # --- the loop -------------------------------------------------------------------------------------------

    def request_relist(self) -> None:
        """End the watch and list again (soon, once; requests while a list runs make another): an object ``keep``
        refused may qualify now, and only a list brings it back."""
        self._relist_wanted.set()

    async def _wait_after(self) -> None:
        """Wait for the informers ``keep`` reads to have synced once, so the first list keeps what it should."""
        for other in self._after() if self._after is not None else ():
            await other._synced.wait()

    async def run(self) -> None:
        """List, then watch, forever (until cancelled), re-listing on 410 and backing off on errors."""
        await self._wait_after()
        need_list = True
        while True:
            watching = False
            try:
                if need_list:
                    if not await self._list():  # an optional path that is not there: synced and empty
                        await asyncio.sleep(self.backoff_max_s)
                        continue
                    need_list = False
                events_before = self.stats.events + self.stats.bookmarks
                started = time.monotonic()
                watching = True
                await self._watch_until_relist()
                self.stats.watch_restarts += 1
                # A watch the server ends at timeoutSeconds is normal: reopen at once. One that ends at once and
                # empty (a proxy or apiserver closing on us) must not turn into a hot loop: back off then -- but
                # within half the grace, or a path that closes watches early yet delivers everything would read as
                # frozen (its clean end was contact; the next watch must come within the bound).
                quiet = self.stats.events + self.stats.bookmarks == events_before
                if quiet and time.monotonic() - started < self.watch_timeout_s / 2:
                    await asyncio.sleep(min(self._backoff.next(), max(self.contact_grace_s / 2, 0.05)))
            except _Gone as exc:
                self.stats.gone += 1
                self.stats.watch_restarts += int(watching)
                need_list = True
                log.info("informer %s: %s; re-listing", self.name, exc)
                if self._events_since_list == 0:
                    # 410 right after a list: something is off (a lagging apiserver behind a load balancer);
                    # re-listing at once could loop, so this one waits like an error does
                    await asyncio.sleep(self._backoff.next())
            except _Relist:
                self.stats.watch_restarts += int(watching)
                need_list = True
            except _NotFound:
                # the optional collection vanished while watching (CRD deleted): the list turns it into "empty"
                self.stats.watch_restarts += 1
                need_list = True
            except Exception as exc:  # network, HTTP, decoding: all retried the same way (CancelledError is not one)
                self.stats.watch_restarts += int(watching)
                self.stats.errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                delay = self._backoff.next()
                log.warning(
                    "informer %s: %s failed: %s; retrying in %.2f s",
                    self.name,
                    "watch" if watching else "list",
                    self.stats.last_error,
                    delay,
                )
                await asyncio.sleep(delay)

    # --- list -----------------------------------------------------------------------------------------------

    def _selectors(self) -> list[tuple[str, str]]:
        params = []
        if self.label_selector:
            params.append(("labelSelector", self.label_selector))
        if self.field_selector:
            params.append(("fieldSelector", self.field_selector))
        return params

    async def _request(self, params: list[tuple[str, str]], timeout: aiohttp.ClientTimeout) -> Any:
        """GET ``path?params`` through the ApiClient (its auth, TLS and token refresh); the raw aiohttp response."""
        return await self._api.call_api(
            self.path,
            "GET",
            query_params=params,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )

    async def _get_page(self, params: list[tuple[str, str]]) -> dict[str, Any]:
        resp = await self._request(params, aiohttp.ClientTimeout(total=self.request_timeout_s))
        try:
            body = await resp.text()
        finally:
            resp.close()
        if resp.status == 200:
            return json.loads(body)
        message = _status_message(resp.status, body)
        if resp.status == 404:
            raise _NotFound(message)
        if _is_gone(resp.status, message):
            raise _Gone(f"list: {message}")
        raise HttpError(resp.status, message)

    async def _list(self) -> bool:
        """One complete paged list, then the cache is replaced. False if an optional path answered 404."""
        self._relist_wanted.clear()  # a request from now on was not served by this list: it makes another
        fresh: dict[str, dict[str, Any]] = {}
        continue_token: str | None = None
        while True:
            params = [("limit", str(self.page_size)), *self._selectors()]
            if continue_token:
                params.append(("continue", continue_token))
            try:
                page = await self._get_page(params)
            except _NotFound as exc:
                if not self.optional:
                    raise HttpError(404, str(exc)) from None
                self.stats.not_found += 1
                log.debug("informer %s: optional path not found (%s)", self.name, exc)
                self._replace({}, None)
                return False
            # list items carry no kind/apiVersion (the list does); fill them in so cached objects look like
            # watched ones and consumers can tell kinds apart
            kind = str(page.get("kind") or "")
            item_kind = kind[: -len("List")] if kind.endswith("List") else kind
            for item in page.get("items") or []:
                item.setdefault("kind", item_kind)
                item.setdefault("apiVersion", page.get("apiVersion"))
                if self.transform is not None:
                    item = self.transform(item)
                if self.keep is not None and not self.keep(item):
                    self.stats.dropped += 1
                    continue
                fresh[object_key(item)] = item
            meta = page.get("metadata") or {}
            continue_token = meta.get("continue") or None
            if not continue_token:
                self._replace(fresh, meta.get("resourceVersion"))
                return True

    def _replace(self, fresh: dict[str, dict[str, Any]], resource_version: str | None) -> None:
        """Swap in a complete list and tell subscribers what changed (per object, then RELIST)."""
        old, self._cache = self._cache, fresh
        self._resource_version = resource_version
        self._touch()  # a complete list (or an optional path's 404): the cache is what the server has now
        self._events_since_list = 0
        first = not self._listed_once
        if resource_version is not None:  # a real list (not an optional path's 404)
            self.stats.lists += 1
            if self._listed_once:
                self.stats.relists += 1
            self._listed_once = True
            self._backoff.reset()
        for key, obj in old.items():
            if key not in fresh:
                self._notify(DELETED, obj)
        for key, obj in fresh.items():
            previous = old.get(key)
            if previous is None:
                self._notify(ADDED, obj)
            elif _rv(previous) != _rv(obj):
                self._notify(MODIFIED, obj)
        if old or (resource_version is not None and not first):
            self._notify(RELIST, {"metadata": {"resourceVersion": resource_version}, "count": len(fresh)})
        if not self._synced.is_set():
            log.info("informer %s: synced (%d objects)", self.name, len(fresh))
        self._synced.set()

    # --- watch ----------------------------------------------------------------------------------------------

    async def _watch_until_relist(self) -> None:
        """:meth:`_watch`, ended early (raising :class:`_Relist`) when a re-list is asked for."""
        if self._relist_wanted.is_set():
            raise _Relist
        watch = asyncio.ensure_future(self._watch())
        wanted = asyncio.ensure_future(self._relist_wanted.wait())
        try:
            await asyncio.wait({watch, wanted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wanted.cancel()
            watch.cancel()  # (a finished one ignores it) the watch's own finally closes its response
            await asyncio.gather(watch, wanted, return_exceptions=True)
        if watch.cancelled():
            raise _Relist
        watch.result()  # it ended first: as it ended (returned, or raised); a re-list asked meanwhile comes next

    async def _watch(self) -> None:
        """One watch stream from the current resourceVersion until the server ends it (returns) or it fails."""
        params = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_timeout_s)),
            *self._selectors(),
        ]
        if self._resource_version:
            params.append(("resourceVersion", self._resource_version))
        # no total timeout (the stream is long-lived); a read timeout at the freeze bound catches a dead connection
        # (or a request held without an answer) that the server can no longer end: past it the cache is frozen
        # anyway, and reopening is the only way back
        read_s = max(self.freeze_after_s, self.watch_timeout_s + 1.0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout_s, sock_read=read_s)
        resp = await self._request(params, timeout)
        try:
            if resp.status != 200:
                message = _status_message(resp.status, await resp.text())
                if resp.status == 404 and self.optional:
                    raise _NotFound(message)
                if _is_gone(resp.status, message):
                    raise _Gone(f"watch: {message}")
                raise HttpError(resp.status, message)
            self.stats.watches += 1
            while True:
                line = await resp.content.readline()
                if not line:
                    # the server ended the watch (timeoutSeconds) or closed the connection cleanly: everything
                    # up to now was delivered
                    self._touch()
                    return
                if line.strip():
                    self._apply(json.loads(line))
        finally:
            resp.close()  # also on cancellation: never leave a watch connection behind

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == ERROR:
            code = int(obj.get("code") or 0)
            message = f"{obj.get('reason')}: {obj.get('message')}"
            if _is_gone(code, message):
                raise _Gone(f"watch ERROR event: {message}")
            raise HttpError(code, f"watch ERROR event: {message}")
        if self.transform is not None and kind in (ADDED, MODIFIED, DELETED):
            obj = self.transform(obj)
        rv = _rv(obj)
        if kind in (ADDED, MODIFIED) and self.keep is not None and not self.keep(obj):
            # not (or no longer) worth caching: gone for the readers if it was there, else only contact
            self.stats.dropped += 1
            if object_key(obj) not in self._cache:
                self._advance(rv)
                return
            kind = DELETED
        if kind == BOOKMARK:
            self.stats.bookmarks += 1
        elif kind in (ADDED, MODIFIED):
            self._cache[object_key(obj)] = obj
            self.stats.events += 1
            self._events_since_list += 1
        elif kind == DELETED:
            self._cache.pop(object_key(obj), None)
            self.stats.events += 1
            self._events_since_list += 1
        else:
            log.warning("informer %s: ignoring watch event of type %r", self.name, kind)
            return
        self._advance(rv)
        if kind != BOOKMARK:
            self._notify(kind, obj)

    def _advance(self, rv: str | None) -> None:
        """A watch event came: the next watch resumes after it, and the server has confirmed the cache."""
        if rv:
            self._resource_version = rv
        self._touch()
        self._backoff.reset()

    def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        for callback in list(self._subscribers):
            try:
                callback(kind, obj)
            except Exception:
                log.exception("informer %s: subscriber %r failed on %s", self.name, callback, kind)


def frozen_informers(informers: Iterable[Informer], now: float | None = None) -> list[str]:
    """The names of the informers whose cache is :meth:`~Informer.frozen` (``now`` on their clock, default: read
    each one's): a caller holds every decision that could harm the fleet while this is not empty."""
    return [i.name for i in informers if i.frozen(now)]
