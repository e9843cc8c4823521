"""Can this executable start here? The checks ``execve`` itself makes, done before ncu runs, and the
dynamic loader's own words in the output afterwards.

Before the run: a missing file or a directory (ENOENT), no execute permission (EACCES), a file that is
neither an ELF executable nor a ``#!`` script, an ELF file for another machine (ENOEXEC), an ELF file
whose program interpreter (the dynamic loader named in its ``PT_INTERP`` header) is not in this image,
and a script whose interpreter is not (both ENOENT, the kernel's most puzzling answer). These are the
kernel's own rules (execve(2), ERRORS), read from the file's first bytes: nothing is run.

After the run: shared libraries are only looked for once the loader runs, by its own search rules
(RPATH, RUNPATH, ``$ORIGIN``, ``LD_LIBRARY_PATH``, ld.so.cache), which this module does not imitate.
When a library or a symbol version is missing the loader says so on the workload's stderr, which ncu
passes through, in glibc's fixed wording (``error while loading shared libraries: LIB: cannot open
shared object file``; ``version `GLIBC_2.34' not found (required by EXE)``), and exits 127.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
from typing import BinaryIO, Mapping

IN_IMAGE_FIX = (
    "profile it in its own image instead: set the annotation gpu.scheduler.io/profiling-form: in-image "
    "on the workload"
)
DEFAULT_STAGE_DIR = "/kratos/stage"  # where the stage-workload init container copies the executable
CANNOT_RUN = 126  # found but cannot be executed (the shell's convention, as for execve's EACCES/ENOEXEC)
NOT_FOUND = 127  # not found (ENOENT), as the shell and the dynamic loader report it

_ELF_MAGIC = b"\x7fELF"
_ET_EXEC, _ET_DYN = 2, 3
_PT_INTERP = 3
# the ELF e_machine values a host of this machine type runs natively (elf.h: EM_*)
_NATIVE_MACHINES = {
    "x86_64": {62: "x86-64", 3: "i386"},
    "amd64": {62: "x86-64", 3: "i386"},
    "aarch64": {183: "AArch64", 40: "ARM"},
    "arm64": {183: "AArch64", 40: "ARM"},
    "ppc64le": {21: "PowerPC64"},
}
_MACHINE_NAMES = {62: "x86-64", 3: "i386", 183: "AArch64", 40: "ARM", 21: "PowerPC64", 243: "RISC-V"}
_SCRIPT_HEADER_BYTES = 256  # the kernel reads at most this much of a #! line (BINPRM_BUF_SIZE)

_MISSING_LIBRARY = re.compile(
    r"^(?:(\S[^\n]*?): )?error while loading shared libraries: (\S+?): (cannot open shared object file[^\n]*)",
    re.M,
)
_MISSING_VERSION = re.compile(r"version `([^']+)' not found \(required by ([^)]+)\)")


def staged(executable: str) -> bool:
    """Whether ``executable`` is one the staged form copied into the runner's image (the stage
    directory is ``$KRATOS_STAGE_DIR``, default /kratos/stage)."""
    stage = os.environ.get("KRATOS_STAGE_DIR") or DEFAULT_STAGE_DIR
    return os.path.abspath(executable).startswith(os.path.abspath(stage) + os.sep)


def resolve(command: str) -> str | None:
    """The file ``command`` names, as execvp would find it: a name without a slash is looked up on
    ``$PATH``; a path is taken as it is (relative to the working directory)."""
    if "/" in command:
        return command
    return shutil.which(command)


def cannot_start(command: str, what: str = "workload executable") -> tuple[str, int]:
    """Why ``command`` (the workload's argv[0], or ncu) cannot be executed here, and the exit status a
    shell would give it; ("", 0) when nothing the kernel checks stands in the way. ``what`` names it."""
    path = resolve(command)
    if path is None:
        search = os.environ.get("PATH") or os.defpath
        return f"{what} {command} not found on PATH ({search})", NOT_FOUND
    if not os.path.exists(path):
        return f"{what} {path} is missing (not found)", NOT_FOUND
    if os.path.isdir(path):
        return f"{what} {path} is a directory, not a program", CANNOT_RUN
    if not os.access(path, os.X_OK):
        return f"{what} {path} is not executable (permission denied)", CANNOT_RUN
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SCRIPT_HEADER_BYTES)
            if head.startswith(_ELF_MAGIC):
                return _elf_problem(path, handle, what)
    except OSError as exc:
        return f"{what} {path} cannot be read: {exc.strerror}", CANNOT_RUN
    if head.startswith(b"#!"):
        return _script_problem(path, head, what)
    return (
        f"{what} {path} is neither an ELF program nor a #! script (exec format error)",
        CANNOT_RUN,
    )


def _elf_problem(path: str, handle: BinaryIO, what: str) -> tuple[str, int]:
    """Why the ELF file at ``path`` cannot run on this machine, and the status, or ("", 0)."""
    handle.seek(0)
    header = handle.read(64)
    if len(header) < 52:
        return f"{what} {path} is a truncated ELF file (exec format error)", CANNOT_RUN
    elf_class, data = header[4], header[5]
    if elf_class not in (1, 2) or data not in (1, 2):
        return f"{what} {path} has an unknown ELF class or byte order (exec format error)", CANNOT_RUN
    order = "<" if data == 1 else ">"
    e_type, e_machine = struct.unpack_from(order + "HH", header, 16)
    if e_type not in (_ET_EXEC, _ET_DYN):
        return (
            f"{what} {path} is an ELF object of type {e_type}, not a program (exec format error)",
            CANNOT_RUN,
        )
    host = os.uname().machine
    native = _NATIVE_MACHINES.get(host)
    if native is not None and e_machine not in native:
        built = _MACHINE_NAMES.get(e_machine, f"ELF machine {e_machine}")
        return f"{what} {path} is built for {built}, and this node is {host} (exec format error)", CANNOT_RUN
    interpreter = _interpreter(header, handle, order, elf_class == 2)
    if interpreter and not os.path.exists(interpreter):
        return (
            f"{what} {path} needs the dynamic loader {interpreter}, which this image does not "
            "have (built for another C library or distribution)",
            NOT_FOUND,
        )
    return "", 0


def _interpreter(header: bytes, handle: BinaryIO, order: str, wide: bool) -> str:
    """The ``PT_INTERP`` path of an ELF file ("" for a static program or a header it cannot read)."""
    if len(header) < (64 if wide else 52):
        return ""
    if wide:
        (phoff,) = struct.unpack_from(order + "Q", header, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 0x36)
        entry = order + "IIQQQQQQ"  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, ...
    else:
        (phoff,) = struct.unpack_from(order + "I", header, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 0x2A)
        entry = order + "IIIIIIII"  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, ...
    if phentsize < struct.calcsize(entry) or phnum > 4096:
        return ""
    for index in range(phnum):
        handle.seek(phoff + index * phentsize)
        raw = handle.read(struct.calcsize(entry))
        if len(raw) < struct.calcsize(entry):
            return ""
        fields = struct.unpack(entry, raw)
        if fields[0] != _PT_INTERP:
            continue
        offset, size = (fields[2], fields[5]) if wide else (fields[1], fields[4])
        handle.seek(offset)
        return handle.read(min(size, 4096)).split(b"\0", 1)[0].decode("utf-8", "replace")
    return ""


def _script_problem(path: str, head: bytes, what: str) -> tuple[str, int]:
    """Why the ``#!`` script at ``path`` cannot start: its interpreter (or, for ``/usr/bin/env NAME``,
    the program env would look up) is missing or not executable."""
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    words = line.split()
    if not words:
        return f"{what} {path} is a script with an empty #! line (exec format error)", CANNOT_RUN
    interpreter = words[0]
    if not os.path.isfile(interpreter):
        return f"{what} {path} is a script for {interpreter}, which this image does not have", NOT_FOUND
    if not os.access(interpreter, os.X_OK):
        return f"{what} {path} is a script for {interpreter}, which is not executable", CANNOT_RUN
    rest = [w for w in words[1:] if not w.startswith("-")]
    if (
        os.path.basename(interpreter) == "env"
        and rest
        and "=" not in rest[0]
        and shutil.which(rest[0]) is None
    ):
        return f"{what} {path} is a script for {rest[0]}, which is not on PATH in this image", NOT_FOUND
    return "", 0


def loader_failure(output: str) -> str:
    """The dynamic loader's complaint in the run's output, in words ("" when there is none)."""
    library = _MISSING_LIBRARY.search(output)
    if library:
        program = library.group(1) or "the workload"
        return f"{program} could not start: shared library {library.group(2)} is missing ({library.group(3).strip()})"
    version = _MISSING_VERSION.search(output)
    if version:
        return (
            f"{version.group(2).strip()} could not start: it needs {version.group(1)}, "
            "which this image's libraries do not have"
        )
    return ""


def with_fix(reason: str, executable: str) -> str:
    """``reason``, and for an executable the staged form copied, the in-image form as the fix."""
    if not staged(executable):
        return reason
    return f"{reason}: the staged form runs it in the Nsight Compute image, apart from its own image; {IN_IMAGE_FIX}"


def child_environment(environ: Mapping[str, str], frozen: bool) -> dict[str, str]:
    """The environment for ncu and the workload: the runner's own, less what the one-file executable's
    bootloader added. PyInstaller's bootloader puts its unpacked libraries first on ``LD_LIBRARY_PATH``
    (the user's value saved as ``LD_LIBRARY_PATH_ORIG``) and sets ``_PYI_*`` variables for itself; a
    workload that inherited them would load the runner's libraries instead of its image's own (the
    PyInstaller manual, "Launching external programs from the frozen application")."""
    env = dict(environ)
    if not frozen:
        return env
    for key in [k for k in env if k.startswith("_PYI_")]:
        del env[key]
    original = env.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        env.pop("LD_LIBRARY_PATH", None)
    else:
        env["LD_LIBRARY_PATH"] = original
    return env
