"""Build the runner as one self-contained executable, ``kratos-runner``, with PyInstaller.

The in-image profiling form runs the runner inside the user's own image, which may have no Python and
no shell. PyInstaller's ``--onefile`` mode bundles the Python interpreter, the standard-library modules
the runner imports and the runner itself into one ELF file that needs only the C library (glibc) at
run time. PyInstaller is the well-kept choice for this (maintained, released several times a year,
Linux/glibc one-file builds are its main use); a hand-made zipapp would still need a python3 in the
image, and Nuitka would need a C compiler in the build.

Usage: ``python runner/build_onefile.py [--out DIR]`` (default: ``runner/dist``). runner/Dockerfile
runs this same script in its build stage, so a local build and the image's are the same build.
The result needs a glibc at least as new as the one it was built against (the symbol versions of the
bundled libpython), so the image builds it on an older distribution than the images it serves.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "kratos-runner"
# standard-library modules the runner never needs, left out to keep the file small: hashlib pulls in
# libcrypto (several MB; random falls back to its own _sha512), bz2/lzma and decimal come with shutil's
# archive and json's optional imports
EXCLUDED = ("hashlib", "bz2", "lzma", "decimal", "_decimal")


def pyinstaller_arguments(out: str, work: str) -> list[str]:
    """The PyInstaller command line (without the interpreter): one file, symbols stripped (the bundled
    libpython is most of the size), nothing asked."""
    arguments = [
        "--onefile", "--strip", "--noconfirm", "--clean", "--log-level", "WARN",
        "--name", NAME, "--paths", HERE,
        "--distpath", out, "--workpath", os.path.join(work, "build"), "--specpath", work,
    ]  # fmt: skip
    for module in EXCLUDED:
        arguments += ["--exclude-module", module]
    return [*arguments, os.path.join(HERE, "kratos_runner", "__main__.py")]


def build(out: str) -> str:
    """Build ``out/kratos-runner`` and return its path; PyInstaller's own messages go to stderr."""
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kratos-onefile-") as work:
        subprocess.run(
            [sys.executable, "-m", "PyInstaller", *pyinstaller_arguments(os.path.abspath(out), work)],
            check=True,
        )
    return os.path.join(out, NAME)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--out", default=os.path.join(HERE, "dist"), help="output folder (default: runner/dist)"
    )
    args = parser.parse_args(argv)
    if importlib.util.find_spec("PyInstaller") is None:
        print("build_onefile: PyInstaller is not installed: pip install pyinstaller", file=sys.stderr)
        return 2
    try:
        path = build(args.out)
    except subprocess.CalledProcessError as exc:
        print(f"build_onefile: PyInstaller failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    print(f"{path}: {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
