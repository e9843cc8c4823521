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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

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

    ``on_replace`` gets every object after each (re)list, ``on_event`` each watch event after that.
    ``synced`` is set after the first successful list and stays set: the cache keeps answering
    from memory while the API is away. ``failing`` says since when the list or watch has failed
    (a refused watch after a good list included); a watch the server opens ends the streak.
    """

    def __init__(
        self,
        list_func: ListFunc,
        *,
        name: str,
        on_replace: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
    ) -> None:
        self.list_func, self.name = list_func, name
        self.on_replace, self.on_event = on_replace, on_event
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
                    log.info("watch expired, relisting", extra={"informer": self.name})
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
        body = await list_raw(self.list_func, **self._selector())
        self.resource_version = str(body.get("metadata", {}).get("resourceVersion", ""))
        self.on_replace(list(body.get("items") or []))
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
