"""The layering contract: hx -> projections -> streams -> schemas, never upward."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hx", "projections", "streams", "schemas")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter with the project's contract in ``cwd``."""
    exe = Path(sys.executable).parent / "lint-imports"
    cmd = [str(exe)] if exe.exists() else ["lint-imports"]
    env = {"PYTHONPATH": str(cwd), "PATH": str(Path(sys.executable).parent)}
    return subprocess.run([*cmd, "--config", str(cwd / "pyproject.toml"), "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, env=env, check=False)


def test_layers_are_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    init = tmp_path / "streams" / "__init__.py"
    init.write_text(init.read_text() + "\nimport projections.base  # an upward import\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "streams" in result.stdout and "projections" in result.stdout
