"""One error tree per layer: every public ``HxError`` subclass lives in its layer's ``errors`` module."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: importing every module (the learner's JAX among them) would
# otherwise stay behind in the test process.
WALK = """
import importlib, inspect, json, pkgutil
from schemas.errors import HxError
found = []
for top in ("schemas", "streams", "projections", "hx"):
    package = importlib.import_module(top)
    names = [top] + [m.name for m in pkgutil.walk_packages(package.__path__, top + ".")
                     if not m.name.endswith("__main__")]
    for name in names:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, HxError) and obj.__module__ == name:
                found.append([obj.__qualname__, name])
print(json.dumps(found))
"""


def home_of(module: str) -> str:
    """The errors module of a module's layer: ``pkg.errors``, inside hx ``hx.<floor>.errors``."""
    parts = module.split(".")
    if parts[0] != "hx":
        return f"{parts[0]}.errors"
    if len(parts) > 2 or (ROOT / "hx" / parts[1]).is_dir():
        return f"hx.{parts[1]}.errors"
    return "hx.errors"  # hx's top-level modules (the entry-point registry)


@functools.cache
def error_classes() -> list[tuple[str, str]]:
    """(class, defining module) of every HxError subclass the four packages define."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", WALK], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    return [(name, module) for name, module in json.loads(out)]


def test_every_error_class_lives_in_its_layers_errors_module() -> None:
    classes = error_classes()
    assert len(classes) > 40, classes  # the walk saw the packages
    # A private class (``_PortTaken``) is a signal inside one module and never leaves it.
    misplaced = [f"{module}.{name} (belongs in {home_of(module)})" for name, module in classes
                 if not name.startswith("_") and module != home_of(module)]
    assert misplaced == []


def test_each_layer_has_one_errors_module_of_classes_only() -> None:
    classes = error_classes()
    homes = {module for _, module in classes if module == home_of(module)}
    assert {"schemas.errors", "streams.errors", "projections.errors", "hx.errors", "hx.harness.errors",
            "hx.runtime.errors", "hx.environments.errors", "hx.learner.errors", "hx.replay.errors",
            "hx.aegis.errors", "hx.report.errors"} <= homes
    for home in homes:
        text = (ROOT / (home.replace(".", "/") + ".py")).read_text()
        assert "\ndef " not in text and "\nasync def " not in text, home  # classes only: a tree to read
