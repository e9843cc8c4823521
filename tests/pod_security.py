"""A checker of the Pod Security Standards' "restricted" level, version v1.28 of the standard
(https://kubernetes.io/docs/concepts/security/pod-security-standards/; the rules the PodSecurity
admission plugin enforces with ``pod-security.kubernetes.io/enforce-version: v1.28``).

Only the rules' fields are read; it returns what an enforcing namespace would refuse, each as a
short sentence, so a test can show the profiling rewrite passes wherever the user's pod does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
     "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
     "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
     "net.ipv4.tcp_keepalive_probes"}
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _containers(pod_spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod_spec.get(key) or []:
            yield _map(container)


def restricted_violations(pod_meta: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> list[str]:
    """Everything the "restricted" level (baseline included) refuses in this pod, empty if none."""
    found: list[str] = []
    pod_sc = _map(pod_spec.get("securityContext"))
    # baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            found.append(f"{key} is true")
    if _map(pod_sc.get("windowsOptions")).get("hostProcess"):
        found.append("pod is a Windows HostProcess pod")
    for volume in pod_spec.get("volumes") or []:
        kinds = set(_map(volume)) - {"name"}
        if "hostPath" in kinds:
            found.append(f"volume {volume.get('name')} is a hostPath")
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(
                f"volume {volume.get('name')} is of a type restricted does not allow: {sorted(kinds)}"
            )
    for sysctl in pod_sc.get("sysctls") or []:
        if _map(sysctl).get("name") not in SAFE_SYSCTLS:
            found.append(f"sysctl {_map(sysctl).get('name')} is not in the safe set")
    for key, value in _map(pod_meta.get("annotations")).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or str(value).startswith("localhost/")
        ):
            found.append(f"AppArmor profile {value} on {key}")
    if _map(pod_sc.get("seccompProfile")).get("type") == "Unconfined":
        found.append("pod seccompProfile is Unconfined")
    if pod_sc.get("runAsUser") == 0:
        found.append("pod runAsUser is 0")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = _map(pod_sc.get("seccompProfile")).get("type") in ("RuntimeDefault", "Localhost")
    selinux = _map(pod_sc.get("seLinuxOptions"))
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append("pod seLinuxOptions are not allowed")
    for container in _containers(pod_spec):
        name = container.get("name")
        sc = _map(container.get("securityContext"))
        if sc.get("privileged"):
            found.append(f"container {name} is privileged")
        if _map(sc.get("windowsOptions")).get("hostProcess"):
            found.append(f"container {name} is a Windows HostProcess container")
        for port in container.get("ports") or []:
            if _map(port).get("hostPort"):
                found.append(f"container {name} uses a hostPort")
        if sc.get("procMount") not in (None, "Default"):
            found.append(f"container {name} procMount is {sc.get('procMount')}")
        c_selinux = _map(sc.get("seLinuxOptions"))
        if c_selinux.get("type", "") not in SELINUX_TYPES or c_selinux.get("user") or c_selinux.get("role"):
            found.append(f"container {name} seLinuxOptions are not allowed")
        capabilities = _map(sc.get("capabilities"))
        added = set(capabilities.get("add") or [])
        if not added <= BASELINE_CAPABILITIES:
            found.append(
                f"container {name} adds capabilities beyond baseline: {sorted(added - BASELINE_CAPABILITIES)}"
            )
        # restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name} must set allowPrivilegeEscalation: false")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"container {name} must drop ALL capabilities")
        if not added <= {"NET_BIND_SERVICE"}:
            found.append(f"container {name} may add only NET_BIND_SERVICE, adds {sorted(added)}")
        if sc.get("runAsNonRoot") is False or not (pod_non_root or sc.get("runAsNonRoot") is True):
            found.append(f"container {name} must run with runAsNonRoot: true (pod or container)")
        if sc.get("runAsUser") == 0:
            found.append(f"container {name} runAsUser is 0")
        seccomp = _map(sc.get("seccompProfile")).get("type")
        if seccomp == "Unconfined" or not (pod_seccomp or seccomp in ("RuntimeDefault", "Localhost")):
            found.append(f"container {name} must use the RuntimeDefault or Localhost seccomp profile")
    return found
