"""The variables the kubelet gives every container for each Service of its namespace ("service links"),
imitated exactly, so the tests meet what a real node hands KRATOS's processes.

Imitates kubernetes v1.28 ``pkg/kubelet/envvars/envvars.go`` (``FromServices``, ``makeLinkVariables``)
and ``pkg/kubelet/kubelet_pods.go`` (``getServiceEnvVarMap``): a Service without a ClusterIP (``None``
or empty) gives none; the name is upper-cased with ``-`` as ``_``; the first port is ``NAME_SERVICE_PORT``
and ``NAME_PORT``; each named port adds ``NAME_SERVICE_PORT_PORTNAME``; each port adds
``NAME_PORT_<port>_<PROTO>`` with ``_PROTO``, ``_PORT`` and ``_ADDR``. With ``enableServiceLinks: false``
only the ``kubernetes`` Service of the ``default`` namespace is injected (the kubelet always adds it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any


def _name(text: str) -> str:
    return text.replace("-", "_").upper()


def _host_port(cluster_ip: str, port: int) -> str:
    """net.JoinHostPort: an IPv6 address in brackets."""
    return (
        f"[{cluster_ip}]:{port}" if ipaddress.ip_address(cluster_ip).version == 6 else f"{cluster_ip}:{port}"
    )


def from_services(services: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """FromServices: the variables for these Service objects (each with ``spec.clusterIP`` set)."""
    env: dict[str, str] = {}
    for service in services:
        spec = service["spec"]
        cluster_ip = spec.get("clusterIP") or "None"
        if cluster_ip == "None":
            continue
        prefix = _name(service["metadata"]["name"])
        ports = spec["ports"]
        env[f"{prefix}_SERVICE_HOST"] = cluster_ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{_name(port['name'])}"] = str(port["port"])
        for index, port in enumerate(ports):
            protocol = port.get("protocol") or "TCP"
            url = f"{protocol.lower()}://{_host_port(cluster_ip, port['port'])}"
            if index == 0:
                env[f"{prefix}_PORT"] = url
            base = f"{prefix}_PORT_{port['port']}_{protocol.upper()}"
            env[base] = url
            env[f"{base}_PROTO"] = protocol.lower()
            env[f"{base}_PORT"] = str(port["port"])
            env[f"{base}_ADDR"] = cluster_ip
    return env


def with_cluster_ips(
    services: Iterable[Mapping[str, Any]], first: str = "10.0.0.100"
) -> list[dict[str, Any]]:
    """Rendered Services as the API server stores them: each given the next ClusterIP from ``first``."""
    address = ipaddress.ip_address(first)
    out = []
    for offset, service in enumerate(services):
        stored = {**service, "spec": {**service["spec"], "clusterIP": str(address + offset)}}
        out.append(stored)
    return out


def for_pod(pod_spec: Mapping[str, Any], services: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """What the kubelet injects into a container of ``pod_spec`` in a namespace holding ``services``:
    every Service's variables unless ``enableServiceLinks`` is false (its default is true), and always
    the master Service's (``KUBERNETES_SERVICE_HOST`` ...)."""
    master = {"metadata": {"name": "kubernetes"},
              "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}  # fmt: skip
    chosen = list(services) if pod_spec.get("enableServiceLinks", True) else []
    return from_services([*chosen, master])
