"""Leader election on a coordination.k8s.io Lease, so two replicas never act at once.

The client-go algorithm in small: acquire when the Lease is free or expired, renew well within
its duration, and stop leading the moment a renewal fails or someone else holds it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from kratos_admit.edge.kube import FailureStreak, one_line

log = logging.getLogger("kratos.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaseNamespaceMissing(Exception):
    """The Lease's namespace does not exist: nothing can lead until someone creates it."""


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        retry_seconds: float = 2.0,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.retry_seconds = lease_seconds, retry_seconds
        self.clock = clock
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self.failing = FailureStreak()  # Lease calls that fail (a lost race for the Lease is no failure)

    def _spec(self, transitions: int, acquired: dt.datetime | None = None) -> client.V1LeaseSpec:
        now = self.clock()
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self.lease_seconds,
            acquire_time=acquired or now,
            renew_time=now,
            lease_transitions=transitions,
        )

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease = await self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace), spec=self._spec(0)
            )
            try:
                await self.coordination.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                if create_exc.status == 404:  # the namespace itself is missing (NamespaceLifecycle)
                    raise LeaseNamespaceMissing(
                        f"the Lease namespace {self.namespace!r} does not exist: create it "
                        f"(kubectl create namespace {self.namespace}) or set leaseNamespace"
                    ) from create_exc
                raise
            return True
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        renewed = spec.renew_time
        duration = spec.lease_duration_seconds or self.lease_seconds
        expired = renewed is None or self.clock() > renewed + dt.timedelta(seconds=duration)
        if holder not in (None, "", self.identity) and not expired:
            return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        acquired = spec.acquire_time if holder == self.identity else None
        lease.spec = self._spec(transitions, acquired)
        try:
            await self.coordination.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:
                return False  # someone else wrote the Lease first
            raise
        return True

    async def run(self) -> None:
        """Campaign until leading, then keep renewing. A leader that cannot renew within the renew
        deadline (two thirds of the lease) stops leading before anyone else may take the Lease."""
        loop = asyncio.get_running_loop()
        renew_deadline = self.lease_seconds * 2 / 3
        last_renewed = 0.0
        said = ""  # the last failure logged: a failure that repeats every retry is said once
        while True:
            try:
                ok = await self.try_acquire_or_renew()
            except LeaseNamespaceMissing as exc:
                if said != str(exc):
                    log.error(str(exc), extra={"lease": self.name})
                said, ok = str(exc), False
                self.failing.failed(said)
            except Exception as exc:  # the API away: keep trying until the renew deadline
                if said != one_line(exc):
                    log.warning("lease call failed", extra={"lease": self.name, "reason": one_line(exc)})
                said, ok = one_line(exc), False
                self.failing.failed(said)
            else:
                said = "" if ok else said
                self.failing.succeeded()
            if ok:
                last_renewed = loop.time()
                if not self.leading.is_set():
                    log.info("became leader", extra={"lease": self.name, "identity": self.identity})
                    self.leading.set()
            elif self.leading.is_set() and loop.time() - last_renewed > renew_deadline:
                log.warning("lost leadership", extra={"lease": self.name, "identity": self.identity})
                self.leading.clear()
                self.lost.set()
                return
            await asyncio.sleep(self.retry_seconds)
