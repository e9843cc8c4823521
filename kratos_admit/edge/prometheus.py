"""Prometheus's HTTP API (``/api/v1/query``), asked for one Pod's DCGM counters over its run.

Layer: edge (aiohttp client). One instant query per counter, all at once, at the run's end: a
query with ``avg_over_time`` drops the metric name from its answer, so one query per name is how
each value keeps its name. The samples go to ``kratos_admit.model.telemetry`` (pure). Every failure is a
``PrometheusError`` whose message is one line naming the URL and what went wrong.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
from collections.abc import Iterable
from typing import Any

import aiohttp

from kratos_admit.domain.config import TelemetryConfig
from kratos_admit.model.telemetry import QUERIED, Sample, pod_query


class PrometheusError(Exception):
    """Prometheus could not answer; the message is one line: the URL, then why."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:300]


def vector_samples(body: Any, name: str, *, url: str) -> list[Sample]:
    """The samples of an instant-vector answer (``{"status": "success", "data": {"resultType":
    "vector", "result": [{"metric": {...}, "value": [ts, "0.7"]}]}}``), named ``name`` where
    Prometheus dropped ``__name__``."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", "no status") if isinstance(body, dict) else "not a JSON object"
        raise PrometheusError(f"{url}: query failed: {_one_line(error)}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        found = data.get("resultType") if isinstance(data, dict) else data
        raise PrometheusError(f"{url}: expected a vector answer, got {_one_line(found)}")
    samples = []
    for item in data.get("result") or []:
        metric = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            raise PrometheusError(f"{url}: a result is not a vector sample: {_one_line(item)}")
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            raise PrometheusError(f"{url}: a sample value is not a number: {_one_line(value[1])}") from None
        labels = {str(k): str(val) for k, val in metric.items() if k != "__name__"}
        samples.append(Sample(str(metric.get("__name__") or name), labels, number))
    return samples


class Prometheus:
    """A client of one Prometheus (config ``telemetry``); ``close`` it when done."""

    def __init__(self, settings: TelemetryConfig) -> None:
        if settings.prometheus_url is None:
            raise ValueError("telemetry.prometheusURL is not set")
        self.url = settings.prometheus_url
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | None:
        if self.settings.ca_file is None:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.settings.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise PrometheusError(
                f"{self.url}: cannot use caFile {self.settings.ca_file}: {_one_line(exc)}"
            ) from None

    def _headers(self) -> dict[str, str]:
        """The bearer token, read at each query: a projected token is rotated on disk."""
        path = self.settings.bearer_token_file
        if path is None:
            return {}
        try:
            token = path.read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise PrometheusError(
                f"{self.url}: cannot read bearerTokenFile {path}: {_one_line(exc)}"
            ) from None
        return {"Authorization": f"Bearer {token}"}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl() or True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def query(self, promql: str, *, at: dt.datetime, name: str = "") -> list[Sample]:
        """One instant query at ``at``; its samples, named ``name`` when the answer drops names."""
        timeout = self.settings.timeout_seconds
        params = {"query": promql, "time": f"{at.timestamp():.3f}", "timeout": f"{timeout:g}s"}
        endpoint = f"{self.url}/api/v1/query"
        try:
            async with self._client().get(
                endpoint,
                params=params,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                text = await response.text()
                status = response.status
        except TimeoutError:
            raise PrometheusError(f"{self.url}: no answer within {timeout:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise PrometheusError(f"{self.url}: {_one_line(exc) or type(exc).__name__}") from None
        try:
            body: Any = json.loads(text) if text else None
        except ValueError:
            body = None
        if status != 200:
            detail = (
                f"{body.get('errorType', '')}: {body.get('error', '')}"
                if isinstance(body, dict) and body.get("error")
                else text
            )
            raise PrometheusError(f"{self.url}: HTTP {status}: {_one_line(detail)}")
        if body is None:
            raise PrometheusError(f"{self.url}: the answer is not JSON: {_one_line(text[:120])}")
        return vector_samples(body, name, url=self.url)

    async def pod_samples(
        self, *, namespace: str, pod: str, end: dt.datetime, seconds: float, names: Iterable[str] = QUERIED
    ) -> list[Sample]:
        """Each counter of the Pod averaged over ``seconds`` before ``end``, per series."""
        labels = self.settings.labels
        answers = await asyncio.gather(
            *(
                self.query(
                    pod_query(name, namespace=namespace, pod=pod, seconds=seconds, labels=labels),
                    at=end,
                    name=name,
                )
                for name in names
            )
        )
        return [sample for answer in answers for sample in answer]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
