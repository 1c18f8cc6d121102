"""The runnable examples in docs/ run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
RUNNABLE = re.compile(r"<!-- runnable[^>]*-->\s*```python\n(.*?)```", re.S)


def runnable_blocks() -> list[tuple[str, str]]:
    """(doc name, code) of every block marked runnable."""
    return [(f"{p.name}#{i}", code) for p in sorted(DOCS.glob("*.md"))
            for i, code in enumerate(RUNNABLE.findall(p.read_text()))]


def run_block(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run one example as a script, on an embedded server under ``tmp_path``."""
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "HX_DATA_DIR": str(tmp_path / "hx-data")}
    env.pop("HX_NATS_URL", None)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize(("where", "code"), runnable_blocks(), ids=lambda v: v if "#" in str(v) else "")
def test_doc_example_runs(where: str, code: str, tmp_path: Path) -> None:
    done = run_block(code, tmp_path)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{where} printed nothing"


def test_harness_doc_example_passes(tmp_path: Path) -> None:
    [code] = [c for w, c in runnable_blocks() if w.startswith("harness.md")]
    done = run_block(code, tmp_path)
    passed, steps, digest = done.stdout.split()
    assert (passed, steps) == ("True", "2") and digest.startswith("sha256:")
    # the embedded server was released when the example finished
    assert not (tmp_path / "hx-data" / "nats" / "server.json").exists()
