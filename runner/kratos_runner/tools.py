"""Lay out the in-image tools tree from an installed Nsight Compute, found by its real ``ncu`` program.

``python3 -m kratos_runner.tools [--ncu PATH] DEST`` (run by runner/Dockerfile at build time) finds the
``ncu`` program itself, wherever the package put it, and copies what the command line needs into
``DEST/nsight-compute``: the program's own folder (``target/<platform>/``: ``ncu`` and the libraries
and helpers it loads from beside itself) and the ``sections/`` folder it reads, kept at the same
relative place (``../../sections`` from the program, where every Nsight Compute layout has it), with
``DEST/nsight-compute/ncu`` a relative link to the program. Nothing else: no GUI (``host/``), docs or
samples. Every file is copied as a file (links dereferenced), so a later ``cp -RP`` of the tree (the
stage-profiler init container) leaves no link dangling but the one it made itself.

Three layouts are known to differ, and none is assumed:
- CUDA's ``cuda-nsight-compute-*`` (``/opt/nvidia/nsight-compute/<version>/``): ``ncu`` is a shell
  script beside ``target/linux-desktop-glibc_*-x64/ncu`` and ``sections/``;
- the CUDA toolkit's ``bin/ncu`` (``/usr/local/cuda/bin/ncu``, as Nvidia's CUDA images have it): a shell
  script that runs the ``ncu`` script of the latest Nsight Compute among
  ``/opt/nvidia/nsight-compute/<version>/`` (the .deb and .rpm installs) and
  ``bin/../nsight-compute-<version>/`` (the .run install), the later of equal versions winning, as the
  script itself chooses;
- Debian's ``nsight-compute`` (2022.3): ``/usr/bin/ncu`` links to the script
  ``/usr/lib/nsight-compute/ncu``, whose ``target/<platform>`` is a link into
  ``/usr/lib/<triplet>/nsight-compute/target/``, beside which ``sections/`` lies.
The program is the native ELF file named ``ncu`` that the path (followed through links) is, or that
sits in ``target/*/`` beside the script the path leads to.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from typing import Sequence, TextIO

from kratos_runner.cli import find_ncu
from kratos_runner.launch import cannot_start

_ELF_MAGIC = b"\x7fELF"
OPT_NSIGHT_COMPUTE = "/opt/nvidia/nsight-compute"  # where the .deb and .rpm installs put each version


class LayoutError(RuntimeError):
    """Nsight Compute is not where the path leads, or not laid out as ncu needs it."""


def _is_program(path: str) -> bool:
    """An ELF file this machine runs (the checks execve makes), not a script or a link to one."""
    try:
        with open(path, "rb") as handle:
            if handle.read(4) != _ELF_MAGIC:
                return False
    except OSError:
        return False
    return cannot_start(path, "ncu")[0] == ""


def _version(name: str) -> tuple[int, ...] | None:
    """``2025.3.1`` (or ``2025.3.1.0``) as numbers; None for a name that is not a version."""
    parts = name.split(".")
    return tuple(int(p) for p in parts) if len(parts) >= 3 and all(p.isdigit() for p in parts) else None


def toolkit_choice(script: str) -> str | None:
    """The Nsight Compute folder the CUDA toolkit's ``bin/ncu`` script at ``script`` runs: the latest
    version among ``/opt/nvidia/nsight-compute/<version>`` and ``<script's folder>/../nsight-compute-<version>``
    (the later one found winning a tie, as the script's own ``-ge`` does); None where there is none."""
    candidates = [(os.path.basename(p), p) for p in sorted(glob.glob(os.path.join(OPT_NSIGHT_COMPUTE, "*")))]
    toolkit = os.path.join(os.path.dirname(script), os.pardir, "nsight-compute-*")
    candidates += [(os.path.basename(p).rsplit("-", 1)[-1], p) for p in sorted(glob.glob(toolkit))]
    best: tuple[tuple[int, ...], str] | None = None
    for name, folder in candidates:
        version = _version(name)
        usable = version is not None and os.access(os.path.join(folder, "ncu"), os.X_OK)
        if usable and version is not None and (best is None or version >= best[0]):
            best = (version, folder)
    return os.path.normpath(best[1]) if best else None


def real_ncu(path: str) -> str:
    """The ``ncu`` program (a native ELF file, links resolved) that ``path`` runs."""
    resolved = os.path.realpath(path)
    if _is_program(resolved):
        return resolved
    beside = sorted(glob.glob(os.path.join(os.path.dirname(resolved), "target", "*", "ncu")))
    if not beside:
        chosen = toolkit_choice(resolved)
        if chosen is not None:
            script = os.path.realpath(os.path.join(chosen, "ncu"))
            if _is_program(script):
                return script
            beside = sorted(glob.glob(os.path.join(os.path.dirname(script), "target", "*", "ncu")))
    programs = sorted({os.path.realpath(p) for p in beside if _is_program(os.path.realpath(p))})
    if len(programs) == 1:
        return programs[0]
    if not programs:
        raise LayoutError(
            f"{path} leads to {resolved}, which is not an ncu program this machine runs, and no "
            "target/*/ncu beside it is"
        )
    raise LayoutError(
        f"{path}: several ncu programs for this machine beside {resolved}: {', '.join(programs)}"
    )


def sections_of(program: str) -> str:
    """The ``sections/`` folder the program reads: two levels above its own folder."""
    sections = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(program))), "sections")
    if not os.path.isdir(sections):
        raise LayoutError(f"no sections/ folder at {sections}, where {program} looks for it")
    return sections


def lay_out(ncu: str, dest: str) -> str:
    """Copy the program's folder and its sections into ``dest/nsight-compute``; return the link
    ``dest/nsight-compute/ncu``."""
    program = real_ncu(ncu)
    platform = os.path.basename(os.path.dirname(program))
    root = os.path.join(dest, "nsight-compute")
    if os.path.exists(root):
        shutil.rmtree(root)
    shutil.copytree(os.path.dirname(program), os.path.join(root, "target", platform), symlinks=False)
    shutil.copytree(sections_of(program), os.path.join(root, "sections"), symlinks=False)
    link = os.path.join(root, "ncu")
    os.symlink(os.path.join("target", platform, "ncu"), link)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if os.path.isdir(path) else 0))
    return link


def tree_size(root: str) -> tuple[int, int]:
    """(bytes, files) of the tree, links not followed."""
    total, count = 0, 0
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                total += os.path.getsize(path)
                count += 1
    return total, count


def main(argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = argparse.ArgumentParser(
        prog="python3 -m kratos_runner.tools",
        description="Copy what ncu's command line needs into DEST/nsight-compute, found by the real program.",
    )
    parser.add_argument("--ncu", help="path to ncu (default: PATH, then the usual install folders)")
    parser.add_argument("dest", help="the tools tree, e.g. /opt/kratos/tools")
    args = parser.parse_args(list(argv))
    ncu = find_ncu(args.ncu)
    if ncu is None:
        print("kratos-runner tools: no ncu found (install Nsight Compute, or pass --ncu PATH)", file=stderr)
        return 1
    started = time.monotonic()
    try:
        link = lay_out(ncu, args.dest)
    except (LayoutError, OSError) as exc:
        print(f"kratos-runner tools: {exc}", file=stderr)
        return 1
    version = subprocess.run([link, "--version"], capture_output=True, text=True, check=False, timeout=120)
    if version.returncode != 0 or "Version" not in version.stdout:
        print(f"kratos-runner tools: {link} --version failed: {version.stdout}{version.stderr}", file=stderr)
        return 1
    size, files = tree_size(os.path.join(args.dest, "nsight-compute"))
    print(
        f"{link} -> {os.readlink(link)}: {version.stdout.strip().splitlines()[-1]}; "
        f"{files} files, {size / 2**20:.1f} MiB, copied in {time.monotonic() - started:.1f} s",
        file=stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
