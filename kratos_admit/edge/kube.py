"""The kubernetes_asyncio edge shared by the webhook's live stores and the profiler controller.

Only this module and the I/O shells that use it touch the network; the policy modules never do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("kratos.kube")
Obj = dict[str, Any]
ListFunc = Callable[..., Awaitable[Any]]


class KubeConfigError(ValueError):
    """No usable cluster credentials; the message says what was tried."""


class ApiUnreachable(KubeConfigError):
    """The API server the credentials name does not answer: said once at start, not retried."""


async def check_reachable(api: client.ApiClient, *, timeout: float = 5.0) -> None:
    """One ``GET /version`` before a command starts work, so an API server that is down or a wrong
    address is said in one line at once instead of as a retry loop or a traceback. Any HTTP answer
    counts (even 401 or 404: that is for the calls that follow to report); only no answer does not."""
    host = api.configuration.host
    try:
        response = await client.VersionApi(api).get_code(_preload_content=False, _request_timeout=timeout)
        response.release()  # type: ignore[attr-defined]  # the raw aiohttp response (no preloading)
    except (aiohttp.ClientError, OSError) as exc:
        reason = getattr(exc, "os_error", None) or exc
        raise ApiUnreachable(
            f"cannot reach the API server at {host}: {_connection_problem(reason)}"
        ) from None
    except TimeoutError:
        raise ApiUnreachable(f"cannot reach the API server at {host}: no answer in {timeout:g} s") from None


def _connection_problem(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()  # "connection refused", not "Connect call failed (...)"
    return " ".join((str(exc) or type(exc).__name__).split())


async def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """In-cluster service account when in a Pod, else --kubeconfig, $KUBECONFIG, ~/.kube/config."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    path = kubeconfig or (
        Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else Path.home() / ".kube" / "config"
    )
    if not path.is_file():
        raise KubeConfigError(
            f"no cluster credentials: not in a Pod, and kubeconfig {path} does not exist (pass --kubeconfig)"
        )
    try:
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: {exc}") from None
    return client.ApiClient(configuration)


def one_line(exc: BaseException) -> str:
    """An API error as one line (status, reason and the server's message), not the client's
    multi-line dump of headers and body."""
    if isinstance(exc, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(exc.body or "{}").get("message", ""))
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, ApiException) and exc.status in codes


async def list_raw(list_func: ListFunc, *args: Any, **kwargs: Any) -> Obj:
    """Call a generated list (or read) function and return the raw JSON (no model round trip loses
    fields); an error status raises ApiException, as the preloading path does."""
    response = await list_func(*args, _preload_content=False, **kwargs)
    try:
        raw = await response.read()
    finally:
        response.release()
    # with _preload_content=False kubernetes_asyncio hands back error responses instead of raising;
    # an error read as an empty list would wipe the cache, so raise as the preloading path does
    if not 200 <= response.status < 300:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = raw  # the server's Status, whose message says why
        raise error
    body: Obj = json.loads(raw)
    return body


# client-go's pager (k8s.io/client-go/tools/pager, defaultPageSize): what a list asks for at a time
PAGE_SIZE = 500


async def list_pages(
    list_func: ListFunc, *args: Any, limit: int = PAGE_SIZE, **kwargs: Any
) -> AsyncIterator[Obj]:
    """A chunked list (``limit`` and ``continue``), one page at a time as the API server sends it, so
    the caller folds a page into its cache before the next is read and never holds the whole list.
    The server serves every page from the snapshot the first was read at (a consistent list, each
    page's ``metadata.resourceVersion`` that snapshot's); a ``continue`` token older than etcd's
    compaction is refused with 410 Gone (reason ``Expired``), and the caller starts over."""
    token = ""
    while True:
        extra = {"_continue": token} if token else {}
        body = await list_raw(list_func, *args, limit=limit, **kwargs, **extra)
        token = str((body.get("metadata") or {}).get("continue") or "")
        yield body
        del body  # folded by the caller: not held while the next page is read
        if not token:
            return


# The metadata-only forms of a list and of a watch's objects (what client-go's metadata informers
# ask for: k8s.io/client-go/metadata), and plain JSON after them, for a server that knows neither
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
PARTIAL_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
# the generated list functions' keywords, as the query parameters they are sent as
_QUERY = {
    "label_selector": "labelSelector",
    "field_selector": "fieldSelector",
    "limit": "limit",
    "_continue": "continue",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "watch": "watch",
}


def metadata_lister(api: client.ApiClient, path: str) -> ListFunc:
    """A list (and watch) of the collection at ``path`` answered as ``PartialObjectMetadataList``
    (a watch's objects as ``PartialObjectMetadata``): each object's metadata alone, its labels
    included, without the spec and status that a Node's kubelet fills (images, conditions,
    addresses). Called as the generated list functions are (``label_selector=``, ``watch=True``,
    ``_preload_content=False``); the generated ones cannot ask for it, as they set ``Accept``
    themselves. Answers raw, as ``list_raw`` and the watch read them."""

    async def list_metadata(**kwargs: Any) -> Any:
        watching = bool(kwargs.get("watch"))
        query = [
            (_QUERY[key], str(value).lower() if isinstance(value, bool) else value)
            for key, value in kwargs.items()
            if key in _QUERY and value not in (None, "")
        ]
        return await api.call_api(
            path,
            "GET",
            query_params=query,
            header_params={"Accept": PARTIAL_WATCH if watching else PARTIAL_LIST},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=kwargs.get("_request_timeout"),
        )

    return list_metadata


class Fold(Protocol):
    """What a cache does with a (re)list, page by page: ``begin`` as a list starts, ``page`` with each
    page's objects (before the next is read), ``end`` once the last page is in (drop what the list did
    not name). A list that fails midway ends without ``end``; the next list begins again."""

    def begin(self) -> None: ...
    def page(self, items: list[Obj]) -> None: ...
    def end(self) -> None: ...


Key = tuple[str, str]  # (namespace, name)


class Sweep:
    """A ``Fold`` for a cache kept by key, by mark and sweep: each page's objects ``store``d as they
    come (it returns the object's key), so the cache answers throughout a relist and never holds a
    second copy; once the last page is in, every key of ``keys()`` the list did not name is
    ``drop``ped. ``on_end`` runs after that."""

    def __init__(
        self,
        store: Callable[[Obj], Key],
        keys: Callable[[], Iterable[Key]],
        drop: Callable[[Key], None],
        on_end: Callable[[], None] = lambda: None,
    ) -> None:
        self.store, self.keys, self.drop, self.on_end = store, keys, drop, on_end
        self.listed: set[Key] = set()

    def begin(self) -> None:
        self.listed = set()

    def page(self, items: list[Obj]) -> None:
        for obj in items:
            self.listed.add(self.store(obj))

    def end(self) -> None:
        for key in set(self.keys()) - self.listed:
            self.drop(key)
        self.listed = set()
        self.on_end()


class Collect:
    """A ``Fold`` for a cache replaced whole: every page's objects handed to ``on_replace`` at the end."""

    def __init__(self, on_replace: Callable[[list[Obj]], None]) -> None:
        self.on_replace = on_replace
        self.items: list[Obj] = []

    def begin(self) -> None:
        self.items = []

    def page(self, items: list[Obj]) -> None:
        self.items.extend(items)

    def end(self) -> None:
        items, self.items = self.items, []
        self.on_replace(items)


class Backoff:
    """Exponential backoff with full jitter (AWS architecture blog), reset after a success."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def next_delay(self) -> float:
        delay = random.uniform(0, min(self.cap, self.base * 2**self.attempt))
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


class FailureStreak:
    """How long a call has been failing: from the first failure of a streak until a success ends it."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.reason = ""

    def failed(self, reason: str) -> None:
        if self.since is None:
            self.since = time.monotonic()
        self.reason = reason

    def succeeded(self) -> None:
        self.since, self.reason = None, ""

    def longer_than(self, seconds: float) -> bool:
        return self.since is not None and time.monotonic() - self.since > seconds


class Informer:
    """List, then watch from the list's resourceVersion; relist on 410 Gone; back off on errors.

    The list is read in pages of ``page_size`` (``list_pages``), each handed to ``fold`` before the
    next is read; ``on_replace`` instead gets every object at once after each (re)list (``Collect``).
    ``on_event`` gets each watch event after that.
    ``synced`` is set after the first successful list and stays set: the cache keeps answering
    from memory while the API is away. ``failing`` says since when the list or watch has failed
    (a refused watch after a good list included); a watch the server opens ends the streak.
    """

    def __init__(
        self,
        list_func: ListFunc,
        *,
        name: str,
        on_event: Callable[[str, Obj], None],
        on_replace: Callable[[list[Obj]], None] | None = None,
        fold: Fold | None = None,
        page_size: int = PAGE_SIZE,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
    ) -> None:
        self.list_func, self.name = list_func, name
        if on_replace is not None and fold is None:
            fold = Collect(on_replace)
        elif fold is None or on_replace is not None:
            raise TypeError("an Informer takes one of fold and on_replace")
        self.fold: Fold = fold
        self.on_event = on_event
        self.page_size = page_size
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.synced = asyncio.Event()
        self.failing = FailureStreak()
        self.relists = 0
        self.resource_version = ""

    def _selector(self) -> dict[str, Any]:
        selectors = {"label_selector": self.label_selector, "field_selector": self.field_selector}
        return {k: val for k, val in selectors.items() if val}

    async def run(self) -> None:
        while True:
            try:
                await self._list()
                while True:
                    await self._watch()
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    log.info(
                        "watch or paged list expired (410 Gone), relisting", extra={"informer": self.name}
                    )
                    continue
                await self._pause(f"API error {one_line(exc)}")
            except Exception as exc:  # network errors of every kind: keep serving from the cache
                await self._pause(one_line(exc))

    async def _pause(self, reason: str) -> None:
        self.failing.failed(reason)
        delay = self.backoff.next_delay()
        log.warning(
            "list/watch failed, retrying",
            extra={"informer": self.name, "reason": reason, "retryIn": round(delay, 2)},
        )
        await asyncio.sleep(delay)

    async def _list(self) -> None:
        self.fold.begin()
        version = ""
        async for body in list_pages(self.list_func, limit=self.page_size, **self._selector()):
            version = str(body.get("metadata", {}).get("resourceVersion", ""))
            self.fold.page(list(body.get("items") or []))
            del body  # not held while the next page is read
        self.resource_version = version
        self.fold.end()
        self.relists += 1
        self.synced.set()
        self.backoff.reset()

    async def _watch(self) -> None:
        stream = watch.Watch()
        async with stream:
            async for event in stream.stream(
                self._open_watch,
                resource_version=self.resource_version,
                timeout_seconds=self.watch_timeout,
                allow_watch_bookmarks=True,
                **self._selector(),
            ):
                raw: Obj = event.get("raw_object") or event.get("object") or {}
                version = raw.get("metadata", {}).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    self.on_event(event["type"], raw)
                self.backoff.reset()

    async def _open_watch(self, *args: Any, **kwargs: Any) -> Any:
        """The watch request; an answer of 200 means the server serves this watch to us."""
        response = await self.list_func(*args, **kwargs)
        if 200 <= int(getattr(response, "status", 0)) < 300:
            self.failing.succeeded()
        return response
