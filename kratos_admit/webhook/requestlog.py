"""The webhook's request log: a line per notable answer, and a burst of the same answer summarised.

Denials, profiling rewrites and answers with warnings are news, and are logged at INFO; plain allows
and hints at DEBUG (a hinted object carries its decision in its ``gpu.scheduler.io/hints``
annotation already). A burst of one answer (a Job array of one bad template, the Pods a controller
keeps creating from it) would write the same line thousands of times, and formatting it was the
largest part of what a denial costs the webhook beyond the floor. So the first answer of a kind is
logged at once, in full; the same answer again within ``window`` seconds (the same webhook,
namespace, kind, operation, outcome, action, workload, message and warnings) is counted, and the
count is written with the next line of its kind after the window, or by ``flush`` (the server calls
it every window and once more when it stops), with the uid and name of the last one counted. Nothing
is dropped: every answer is a line or a count, and the metrics count each. At log level DEBUG every
answer is written on its own line, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kratos_admit.admission.engine import ReviewResult

WINDOW_SECONDS: Final = 10.0
MAX_KINDS: Final = 1024  # answers of distinct kinds remembered at once; the oldest is flushed first

Key = tuple[Any, ...]


@dataclass(slots=True)
class _Seen:
    logged_at: float
    fields: dict[str, Any]  # what every answer of the kind shares, for the summary line
    repeats: int = 0
    last: tuple[str, str] = ("", "")  # (uid, objectName) of the last one counted


class RequestLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        window: float = WINDOW_SECONDS,
        max_kinds: int = MAX_KINDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.window, self.max_kinds, self.clock = logger, window, max_kinds, clock
        self._seen: dict[Key, _Seen] = {}

    def write(self, webhook: str, result: ReviewResult, elapsed: float) -> None:
        decision = result.decision
        notable = result.outcome == "denied" or decision.action == "profiling" or bool(decision.warnings)
        if not notable:
            if self.log.isEnabledFor(logging.DEBUG):
                self._line(logging.DEBUG, webhook, result, elapsed, repeats=0)
            return
        if not self.log.isEnabledFor(logging.INFO):
            return
        if self.log.isEnabledFor(logging.DEBUG):  # DEBUG: every answer its own line
            self._line(logging.INFO, webhook, result, elapsed, repeats=0)
            return
        asked = result.request
        status = result.body["response"].get("status")
        key = (
            webhook,
            asked.namespace,
            asked.kind_name,
            asked.operation,
            result.outcome,
            decision.action,
            asked.profile_key,
            status.get("message") if isinstance(status, dict) else None,
            tuple(decision.warnings),
        )
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.logged_at < self.window:
            seen.repeats += 1
            seen.last = (asked.uid, asked.name)
            return
        repeats = 0
        if seen is not None:
            repeats = seen.repeats
            del self._seen[key]  # to the end: the dict's order is the order of the last line
        fields = self._line(logging.INFO, webhook, result, elapsed, repeats=repeats)
        self._seen[key] = _Seen(now, fields)
        while len(self._seen) > self.max_kinds:
            oldest = next(iter(self._seen))
            self._summary(self._seen.pop(oldest))

    def flush(self, *, everything: bool = False) -> None:
        """Write the count of each kind whose window has passed (``everything``: of every kind), and
        forget the kinds with nothing counted since their last line."""
        now = self.clock()
        for key, seen in list(self._seen.items()):
            if not everything and now - seen.logged_at < self.window:
                continue
            if seen.repeats:
                self._summary(seen)
                seen.repeats, seen.logged_at = 0, now
            else:
                del self._seen[key]

    async def run(self) -> None:
        """Flush every window until cancelled (the server flushes the rest once it has drained)."""
        while True:
            await asyncio.sleep(self.window)
            self.flush()

    def _line(
        self, level: int, webhook: str, result: ReviewResult, elapsed: float, *, repeats: int
    ) -> dict[str, Any]:
        asked = result.request
        shared = {
            "webhook": webhook,
            "kind": asked.kind_name,
            "namespace": asked.namespace,
            "operation": asked.operation,
            "outcome": result.outcome,
            "action": result.decision.action,
            "violations": [str(e) for e in result.decision.violations],
        }
        extra = {"uid": asked.uid, **shared, "objectName": asked.name, "durationMs": round(elapsed * 1000, 3)}
        if repeats:
            extra["repeatsBefore"] = repeats  # answered like this one since its last line, not logged
        self.log.log(level, "admission", extra=extra)
        return shared

    def _summary(self, seen: _Seen) -> None:
        uid, name = seen.last
        self.log.info(
            "admission repeated",
            extra={
                **seen.fields,
                "repeats": seen.repeats,
                "windowSeconds": self.window,
                "lastUid": uid,
                "lastObjectName": name,
            },
        )
