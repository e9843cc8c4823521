"""A local kubelet: runs a Pod spec's containers as real processes on this machine, as the kubelet and
a container runtime would, so a test can run the profiling Pod KRATOS writes instead of reading it.

What it imitates, and how:
- **Images.** An ``Image`` is the host's system directories it shares (bound read-only, its base
  layer: ``/usr`` and ``/etc`` for an image with a shell and Python; only ``/usr/lib`` and
  ``/usr/lib64`` for one that has glibc and nothing else), a directory of its own files copied into
  the container's root (its own layer), and its config's ``Env``, ``WorkingDir`` and ``Entrypoint``.
- **No GPU software from the host.** A container image holds only what it was built with, so the
  host's Nsight Compute, CUDA toolkit and driver libraries never show through the shared system
  directories: every path of ``HOST_GPU_SOFTWARE`` that exists on the host is hidden in the
  container (an empty read-only folder over a folder, ``/dev/null`` over a file). A machine with
  Nsight Compute, CUDA or a driver installed runs the same containers as one without (issue 30).
- **The container's filesystem.** Each container gets its own root directory and its own mount
  namespace (``unshare --mount``), then ``chroot``: what it sees is its image, its volume mounts and
  ``/dev/termination-log``, nothing else of the host.
- **Volumes.** ``emptyDir`` is a directory shared by the Pod's containers, created world-writable as
  the kubelet creates it; a mount with ``readOnly`` is bound read-only. Other volume kinds are refused.
- **Command.** ``command`` replaces the image's entrypoint and ``args`` its cmd, as Kubernetes
  documents; ``command[0]`` is looked up on the container's ``PATH`` (the image's, unless the Pod
  sets one). ``env`` overlays the image's; ``valueFrom`` and ``envFrom`` are refused (nothing here
  serves ConfigMaps or Secrets).
- **Users.** ``runAsUser``/``runAsGroup`` (container, else Pod security context) are applied before
  the command starts.
- **Order.** Init containers run one after the other and each must succeed before the next starts;
  then the Pod's containers run (one after the other here: the profiling Pod has one).
- **Termination message.** ``/dev/termination-log`` is a file of its own per container, read back
  after it ends (``terminationMessagePolicy: File``).

It needs root and mount namespaces (``unshare``), which the machines this project runs its tests on
have; ``available()`` says why not where they are missing, for a test to skip with that reason.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Debian's merged /usr: the top-level directories an image's binaries expect, as links into /usr
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
DEVICES = ("null", "zero", "random", "urandom")
# Where Nsight Compute, the CUDA toolkit and the driver's user-space libraries install themselves
# (Debian's nsight-compute and nvidia-* packages, CUDA's cuda-* packages and run files, NVIDIA's driver
# installer); globs, matched on the host under the shared system directories only.
HOST_GPU_SOFTWARE = (
    "/usr/bin/ncu", "/usr/bin/nv-nsight-cu-cli", "/usr/bin/ncu-ui", "/usr/bin/nvidia-smi", "/usr/bin/nvcc",
    "/usr/lib/nsight-compute", "/usr/lib/*-linux-gnu/nsight-compute", "/usr/local/cuda", "/usr/local/cuda-*",
    "/usr/local/bin/ncu", "/opt/nvidia", "/usr/lib/*-linux-gnu/libcuda.so*", "/usr/lib/*-linux-gnu/libnvidia-*.so*",
    "/usr/lib64/libcuda.so*", "/usr/lib/*-linux-gnu/nvidia",
)  # fmt: skip


class KubeletError(RuntimeError):
    """A Pod spec this local kubelet cannot run as written; the message names the field."""


@dataclass(frozen=True)
class Image:
    name: str
    system: tuple[str, ...] = ("/usr", "/etc")  # host directories the image shares, read-only
    files: Path | None = None  # the image's own layer: a tree copied into the container's root
    env: Mapping[str, str] = field(default_factory=lambda: {"PATH": "/usr/local/bin:/usr/bin:/bin"})
    workdir: str = "/"
    entrypoint: tuple[str, ...] = ()


GLIBC_ONLY = ("/usr/lib", "/usr/lib64")  # an image with the C library and nothing else: no shell, no Python


@dataclass(frozen=True)
class ContainerRun:
    name: str
    exit_code: int
    log: str
    termination_message: str


def available() -> str | None:
    """Why containers cannot run here, or None when they can."""
    if sys.platform != "linux":
        return "the local kubelet needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "the local kubelet needs root (mount namespaces, bind mounts, chroot)"
    if shutil.which("unshare") is None:
        return "the local kubelet needs unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"mount namespaces are not allowed here: {probe.stderr.strip()}"
    return None


def _env(container: Mapping[str, Any], image: Image, where: str) -> dict[str, str]:
    if container.get("envFrom"):
        raise KubeletError(f"{where}.envFrom: no ConfigMap or Secret is served by the local kubelet")
    env = dict(image.env)
    for i, item in enumerate(container.get("env") or []):
        if "valueFrom" in item:
            raise KubeletError(f"{where}.env[{i}].valueFrom: not served by the local kubelet")
        env[item["name"]] = str(item.get("value", ""))
    return env


def _argv(container: Mapping[str, Any], image: Image, where: str) -> list[str]:
    command = list(container.get("command") or image.entrypoint)
    args = list(container.get("args") or [])
    if not command and not args:
        raise KubeletError(f"{where}: neither command nor args, and image {image.name} has no entrypoint")
    return command + args if command else args


def _user(container: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> tuple[int | None, int | None]:
    pod = pod_spec.get("securityContext") or {}
    own = container.get("securityContext") or {}
    uid = own.get("runAsUser", pod.get("runAsUser"))
    gid = own.get("runAsGroup", pod.get("runAsGroup"))
    return uid, gid


def hidden_gpu_software(system: Sequence[str]) -> list[str]:
    """The host's GPU software under the directories an image shares (``HOST_GPU_SOFTWARE``), to hide.
    A link is hidden by hiding what it leads to, when that is shared too."""
    found: set[str] = set()
    for pattern in HOST_GPU_SOFTWARE:
        for path in glob.glob(pattern):
            for candidate in (path, os.path.realpath(path)):
                if any(candidate == d or candidate.startswith(d.rstrip("/") + "/") for d in system):
                    found.add(candidate)
    return sorted(found)


def _container_root(root: Path, image: Image) -> None:
    for name in ("usr", "etc", "tmp", "proc", "dev", "opt"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link, target in MERGED_USR_LINKS.items():
        if not (root / link).exists():
            (root / link).symlink_to(target)
    if image.files is not None:
        shutil.copytree(image.files, root, symlinks=True, dirs_exist_ok=True)


# Run inside `unshare --mount`: bind what the container sees into its root, chroot, become its user,
# exec its command. Written as a script of its own so that only it runs in the new namespace.
LAUNCHER = r"""
import json, os, subprocess, sys
spec = json.load(open(sys.argv[1]))
root = spec["root"]
def bind(source, target, read_only):
    subprocess.run(["mount", "--bind", source, target], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)
for source in spec["system"]:
    target = root + source
    os.makedirs(target, exist_ok=True)
    bind(source, target, True)
for hidden in spec["hidden"]:
    target = root + hidden
    if os.path.isdir(target) and not os.path.islink(target):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=4k", "none", target], check=True)
    elif os.path.lexists(target) and not os.path.islink(target):
        bind("/dev/null", target, True)
for device in spec["devices"]:
    target = root + "/dev/" + device
    open(target, "a").close()
    bind("/dev/" + device, target, False)
for source, target, read_only in spec["mounts"]:
    os.makedirs(root + target, exist_ok=True)
    bind(source, root + target, read_only)
log = root + "/dev/termination-log"
open(log, "a").close()
bind(spec["termination"], log, False)
subprocess.run(["mount", "-t", "proc", "proc", root + "/proc"], check=True)
os.chroot(root)
os.chdir(spec["workdir"])
if spec["gid"] is not None:
    os.setgroups([])
    os.setgid(spec["gid"])
if spec["uid"] is not None:
    os.setuid(spec["uid"])
try:
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
except OSError as exc:
    sys.stderr.write("local kubelet: cannot start " + spec["argv"][0] + ": " + exc.strerror + "\n")
    sys.exit(127 if exc.errno == 2 else 126)
"""


def run_container(
    container: Mapping[str, Any],
    *,
    pod_spec: Mapping[str, Any],
    image: Image,
    volumes: Mapping[str, Path],
    workdir: Path,
    where: str,
    timeout: float,
) -> ContainerRun:
    name = container["name"]
    root = workdir / "roots" / name
    _container_root(root, image)
    mounts = []
    for i, mount in enumerate(container.get("volumeMounts") or []):
        if mount["name"] not in volumes:
            raise KubeletError(f"{where}.volumeMounts[{i}].name: no volume {mount['name']!r} in the Pod")
        mounts.append((str(volumes[mount["name"]]), mount["mountPath"], bool(mount.get("readOnly"))))
    termination = workdir / "termination" / name
    termination.parent.mkdir(parents=True, exist_ok=True)
    termination.write_text("")
    termination.chmod(0o666)
    uid, gid = _user(container, pod_spec)
    spec = {
        "root": str(root),
        "system": list(image.system),
        "hidden": hidden_gpu_software(image.system),
        "devices": list(DEVICES),
        "mounts": mounts,
        "termination": str(termination),
        "workdir": container.get("workingDir") or image.workdir,
        "uid": uid,
        "gid": gid,
        "argv": _argv(container, image, where),
        "env": _env(container, image, where),
    }
    spec_file = workdir / f"{name}.json"
    spec_file.write_text(json.dumps(spec))
    launcher = workdir / "launcher.py"
    launcher.write_text(LAUNCHER)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, str(launcher), str(spec_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    return ContainerRun(name, done.returncode, done.stdout, termination.read_text())


def run_pod(
    pod_spec: Mapping[str, Any], images: Mapping[str, Image], workdir: Path, *, timeout: float = 120
) -> list[ContainerRun]:
    """Every container of ``pod_spec`` in the kubelet's order; stops at the first init container that
    fails, as the kubelet does for ``restartPolicy: Never``."""
    volumes: dict[str, Path] = {}
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        if "emptyDir" not in volume:
            raise KubeletError(f"spec.volumes[{i}]: only emptyDir is served by the local kubelet")
        path = workdir / "volumes" / volume["name"]
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        volumes[volume["name"]] = path
    runs: list[ContainerRun] = []
    sections: Sequence[tuple[str, list[Mapping[str, Any]]]] = (
        ("initContainers", list(pod_spec.get("initContainers") or [])),
        ("containers", list(pod_spec.get("containers") or [])),
    )
    for section, containers in sections:
        for i, container in enumerate(containers):
            where = f"spec.{section}[{i}]"
            if container["image"] not in images:
                raise KubeletError(
                    f"{where}.image: {container['image']!r} is not an image this test provides"
                )
            run = run_container(
                container,
                pod_spec=pod_spec,
                image=images[container["image"]],
                volumes=volumes,
                workdir=workdir,
                where=where,
                timeout=timeout,
            )
            runs.append(run)
            if section == "initContainers" and run.exit_code != 0:
                return runs
    return runs
