"""The in-image tools tree (``python3 -m kratos_runner.tools``, run by runner/Dockerfile), laid out from
Nsight Compute's two real layouts, rebuilt here from their shapes (names, links, the wrapper script):
CUDA's ``cuda-nsight-compute-*`` and Debian's ``nsight-compute`` 2022.3 (``dpkg -L nsight-compute
nsight-compute-target`` of 2022.3.0.22~11.8.0-5~deb12u1). No real ncu is run: the suite is hermetic."""

from __future__ import annotations

import io
import os
import platform
from pathlib import Path

import pytest

from kratos_runner import tools
from kratos_runner.tools import LayoutError, lay_out, main, real_ncu
from tests.builders import EM_AARCH64, EM_X86_64, elf_program

NATIVE = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}.get(platform.machine())
pytestmark = pytest.mark.skipif(
    NATIVE is None, reason=f"no ELF machine number known for {platform.machine()}"
)
PLATFORM = "linux-desktop-glibc_2_11_3-x64"
# Debian's and CUDA's ncu wrapper: picks target/<platform>/ncu by `uname -m` (abridged, same shape)
WRAPPER = (
    '#!/bin/bash\nAPPDIR="$(dirname "$(readlink -f -- "$0")")"\n"$APPDIR/target/' + PLATFORM + '/ncu" "$@"\n'
)


def program(path: Path, machine: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(elf_program(machine or NATIVE or 0))
    path.chmod(0o755)
    return path


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def cuda_layout(root: Path) -> Path:
    """/opt/nvidia/nsight-compute/2024.3.2: the wrapper, target/<platform>/, sections/, host/, docs/."""
    base = root / "opt" / "nvidia" / "nsight-compute" / "2024.3.2"
    program(base / "target" / PLATFORM / "ncu")
    write(base / "target" / PLATFORM / "libnvperf_host.so", "lib")
    write(base / "sections" / "SpeedOfLight.section", 'Identifier: "SpeedOfLight"\n')
    write(base / "host" / "linux-desktop-glibc_2_11_3-x64" / "ncu-ui.bin", "gui")
    write(base / "docs" / "index.html", "docs")
    (root / "usr" / "local" / "cuda" / "bin").mkdir(parents=True)
    (root / "usr" / "local" / "cuda" / "bin" / "ncu").symlink_to(base / "ncu")
    write(base / "ncu", WRAPPER, 0o755)
    return root / "usr" / "local" / "cuda" / "bin" / "ncu"


def debian_layout(root: Path) -> Path:
    """/usr/bin/ncu -> ../lib/nsight-compute/ncu (the wrapper), whose target/<platform> links to
    /usr/lib/x86_64-linux-gnu/nsight-compute/target/<platform>, beside sections/."""
    arch = root / "usr" / "lib" / "x86_64-linux-gnu" / "nsight-compute"
    program(arch / "target" / PLATFORM / "ncu")
    write(arch / "target" / PLATFORM / "libcuda-injection.so", "lib")
    write(arch / "sections" / "SpeedOfLight.section", 'Identifier: "SpeedOfLight"\n')
    lib = root / "usr" / "lib" / "nsight-compute"
    write(lib / "ncu", WRAPPER, 0o755)
    (lib / "target").mkdir(parents=True)
    (lib / "target" / PLATFORM).symlink_to(Path("../../x86_64-linux-gnu/nsight-compute/target") / PLATFORM)
    write(lib / "host" / "linux-desktop-glibc_2_11_3-x64" / "ncu-ui.bin", "gui")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "ncu").symlink_to("../lib/nsight-compute/ncu")
    return root / "usr" / "bin" / "ncu"


# the CUDA toolkit's bin/ncu (CUDA 13.0, as on Nvidia's images): it runs the ncu script of the latest
# Nsight Compute among /opt/nvidia/nsight-compute/<version> and bin/../nsight-compute-<version> (abridged)
TOOLKIT_WRAPPER = (
    '#!/bin/sh\nCUDA_TOOLKIT_BIN_DIR="$(dirname "$(readlink -f -- "$0")")"\n'
    'for d in /opt/nvidia/nsight-compute/* "$CUDA_TOOLKIT_BIN_DIR"/../nsight-compute-*; do :; done\n'
    'exec "$LATEST_NSIGHT_COMPUTE_TOOL_DIR/ncu" "$@"\n'
)


def nsight_compute(base: Path) -> Path:
    """One Nsight Compute version's folder: its wrapper, target/<platform>/ncu and sections/."""
    program(base / "target" / PLATFORM / "ncu")
    write(base / "sections" / "SpeedOfLight.section", f'Identifier: "SpeedOfLight"\n# {base.name}\n')
    write(base / "ncu", WRAPPER, 0o755)
    return base


def toolkit_layout(
    root: Path, monkeypatch: pytest.MonkeyPatch, opt: tuple[str, ...], run: tuple[str, ...]
) -> Path:
    """/usr/local/cuda -> cuda-13.0, whose bin/ncu is the toolkit's script; Nsight Compute versions
    under /opt/nvidia/nsight-compute/ (.deb) and beside bin/ as nsight-compute-<version> (.run)."""
    toolkit = root / "usr" / "local" / "cuda-13.0"
    write(toolkit / "bin" / "ncu", TOOLKIT_WRAPPER, 0o755)
    (root / "usr" / "local" / "cuda").symlink_to("cuda-13.0")
    (root / "opt" / "nvidia" / "nsight-compute").mkdir(parents=True)
    for version in opt:
        nsight_compute(root / "opt" / "nvidia" / "nsight-compute" / version)
    for version in run:
        nsight_compute(toolkit / f"nsight-compute-{version}")
    monkeypatch.setattr(tools, "OPT_NSIGHT_COMPUTE", str(root / "opt" / "nvidia" / "nsight-compute"))
    return root / "usr" / "local" / "cuda" / "bin" / "ncu"


@pytest.mark.parametrize(
    ("opt", "run", "chosen"),
    [
        pytest.param(("2024.1.1", "2025.3.1"), (), "opt/nvidia/nsight-compute/2025.3.1", id="deb-install-latest-of-two"),
        pytest.param((), ("2025.3.1",), "usr/local/cuda-13.0/nsight-compute-2025.3.1", id="run-install-beside-bin"),
        pytest.param(("2025.2.0",), ("2025.3.1",), "usr/local/cuda-13.0/nsight-compute-2025.3.1", id="the-later-version-wins"),
    ],
)  # fmt: skip
def test_the_cuda_toolkits_ncu_script_leads_to_the_nsight_compute_it_would_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opt: tuple[str, ...], run: tuple[str, ...], chosen: str
):
    ncu = toolkit_layout(tmp_path / "root", monkeypatch, opt, run)
    expected = (tmp_path / "root" / chosen / "target" / PLATFORM / "ncu").resolve()
    assert real_ncu(str(ncu)) == str(expected)
    link = lay_out(str(ncu), str(tmp_path / "tools"))
    sections = tmp_path / "tools" / "nsight-compute" / "sections" / "SpeedOfLight.section"
    assert Path(chosen).name in sections.read_text(), "the sections of the version the script runs"
    assert Path(link).resolve().name == "ncu"


def test_a_toolkit_script_with_no_nsight_compute_installed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    ncu = toolkit_layout(tmp_path / "root", monkeypatch, (), ())
    with pytest.raises(LayoutError, match="no target/\\*/ncu beside it is"):
        real_ncu(str(ncu))


@pytest.mark.parametrize("layout", [cuda_layout, debian_layout], ids=["cuda", "debian"])
def test_the_tree_holds_the_real_program_its_folder_and_sections_and_nothing_else(tmp_path: Path, layout):
    ncu = layout(tmp_path / "root")
    link = lay_out(str(ncu), str(tmp_path / "tools"))
    tree = tmp_path / "tools" / "nsight-compute"
    assert link == str(tree / "ncu") and os.readlink(link) == f"target/{PLATFORM}/ncu"
    assert Path(link).resolve() == (tree / "target" / PLATFORM / "ncu").resolve()
    files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() or p.is_symlink())
    assert files[0] == "ncu" and files[-1].startswith(f"target/{PLATFORM}/")
    assert "sections/SpeedOfLight.section" in files
    assert not [f for f in files if f.startswith(("host", "docs"))], "no GUI, no docs"
    # the only link is the one the layout made: a cp -RP of the tree leaves nothing dangling
    assert [p.name for p in tree.rglob("*") if p.is_symlink()] == ["ncu"]
    assert real_ncu(link) == str((tree / "target" / PLATFORM / "ncu").resolve())


def test_a_wrapper_with_no_program_for_this_machine_is_named(tmp_path: Path):
    ncu = debian_layout(tmp_path / "root")
    other = EM_AARCH64 if NATIVE == EM_X86_64 else EM_X86_64
    program(
        tmp_path
        / "root"
        / "usr"
        / "lib"
        / "x86_64-linux-gnu"
        / "nsight-compute"
        / "target"
        / PLATFORM
        / "ncu",
        other,
    )
    with pytest.raises(
        LayoutError, match="not an ncu program this machine runs, and no target/\\*/ncu beside it is"
    ):
        lay_out(str(ncu), str(tmp_path / "tools"))


def test_a_program_without_its_sections_is_named(tmp_path: Path):
    ncu = cuda_layout(tmp_path / "root")
    for section in (
        tmp_path / "root" / "opt" / "nvidia" / "nsight-compute" / "2024.3.2" / "sections"
    ).iterdir():
        section.unlink()
    (tmp_path / "root" / "opt" / "nvidia" / "nsight-compute" / "2024.3.2" / "sections").rmdir()
    with pytest.raises(LayoutError, match=r"no sections/ folder at .*2024\.3\.2/sections"):
        lay_out(str(ncu), str(tmp_path / "tools"))


def test_the_command_says_what_is_wrong_in_one_line(tmp_path: Path):
    err = io.StringIO()
    assert main(["--ncu", str(tmp_path / "absent"), str(tmp_path / "tools")], io.StringIO(), err) == 1
    assert (
        err.getvalue() == "kratos-runner tools: no ncu found (install Nsight Compute, or pass --ncu PATH)\n"
    )
    script = write(tmp_path / "ncu", "#!/bin/sh\necho not nsight\n", 0o755)
    err = io.StringIO()
    assert main(["--ncu", str(script), str(tmp_path / "tools")], io.StringIO(), err) == 1
    assert "is not an ncu program this machine runs" in err.getvalue() and err.getvalue()[-1] == "\n"
