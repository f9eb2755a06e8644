"""The wheel holds every file the package opens at run time. A wheel is built offline from a copy of the repository's
tracked files (``pip wheel --no-deps --no-build-isolation --no-index``), and every file git tracks under
``dspark_lightning/`` must be in it: the modules, and the data files beside them (the built-in prompts, vLLM's pinned
requirements) that only ``[tool.setuptools.package-data]`` in pyproject.toml puts there, so a new data file the
package-data misses fails here."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dspark_lightning"


def tracked(*paths: str) -> list[str]:
    """The files git tracks under ``paths`` (relative to the repository), those present in the work tree."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: which files the package holds is unknown")
    return sorted(f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file())


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> set[str]:
    """The file list of a wheel built from the tracked package, pyproject.toml and README.md."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist = tmp / "src", tmp / "dist"
    for f in tracked(PACKAGE, "pyproject.toml", "README.md"):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*cmd, "-q", "-w", str(dist)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (wheel,) = dist.glob("dspark_lightning-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_every_tracked_file_of_the_package_is_in_the_wheel(wheel_files):
    files = tracked(PACKAGE)
    data = [f for f in files if not f.endswith(".py")]
    assert f"{PACKAGE}/export/vllm_requirements.txt" in data and f"{PACKAGE}/export/vllm.py" in files
    missing = [f for f in data if f not in wheel_files]
    assert not missing, f"not in the wheel: {missing}; add them to [tool.setuptools.package-data] in pyproject.toml"
    modules = [f for f in files if f.endswith(".py") and f not in wheel_files]
    assert not modules, f"modules not in the wheel: {modules}"


def test_the_files_the_package_opens_by_path_are_in_the_wheel(wheel_files):
    """The paths the modules build from their own location (``Path(__file__)``) name files the wheel holds."""
    from dspark_lightning.data.prompts.sources import SelfChat
    from dspark_lightning.export.vllm import REQUIREMENTS, WORKER

    pkg = ROOT / PACKAGE
    opened = [REQUIREMENTS, WORKER, Path(SelfChat().path)]
    assert all(p.is_file() for p in opened), opened
    names = [p.resolve().relative_to(pkg.resolve()).as_posix() for p in opened]
    assert [n for n in names if f"{PACKAGE}/{n}" not in wheel_files] == []
