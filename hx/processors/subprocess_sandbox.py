"""D5 ``subprocess_sandbox``: the policy side of the code sandbox, checked before code runs.

Failure addressed: model-written code that escapes or defeats the execution
environment. The sandbox tool (``hx.processors.sandbox.PythonSandboxTool``) bounds time
and memory and blocks the network, but its socket guard is best effort and a process
running as root can raise its own limits. This processor refuses, before anything
runs, code-running calls that are too large or that reach for the escape hatches:
importing modules that spawn processes, open sockets or change limits (``subprocess``,
``socket``, ``ctypes``, ``resource`` ...) or calling ``os.system``-like functions; it
also clamps a requested ``timeout_s`` to the policy's maximum. A refused call never
reaches the tool, and (when attached at after_tool too) the model is told why.

Attach with ``attach(SubprocessSandbox.accepted_hooks(), SubprocessSandbox())``.
"""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from typing import ClassVar

import msgspec

from hx.harness.processor import PRE, Processor
from hx.processors._hookutil import matches_any
from hx.processors.refusal import Refusals
from schemas.hooks import AfterTool, BeforeTool

DEFAULT_FORBIDDEN_MODULES = (
    "socket", "ssl", "http.client", "urllib.request", "requests", "httpx", "aiohttp",
    "subprocess", "multiprocessing", "pty", "ctypes", "cffi", "resource", "signal",
)
DEFAULT_FORBIDDEN_CALLS = ("os.system", "os.popen", "os.fork", "os.forkpty", "os.exec*", "os.spawn*",
                           "os.posix_spawn*", "os.kill", "os.killpg", "os.setrlimit")


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _covered(module: str, forbidden: tuple[str, ...]) -> str | None:
    """The forbidden entry ``module`` falls under (the module itself or a parent package)."""
    for banned in forbidden:
        if module == banned or module.startswith(banned + "."):
            return banned
    return None


def code_violations(code: str, forbidden_modules: tuple[str, ...], forbidden_calls: tuple[str, ...]) -> list[str]:
    """Why ``code`` breaks the policy (empty when it does not, or does not parse: the sandbox reports that)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            dynamic = name in ("__import__", "importlib.import_module", "import_module")
            if dynamic and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                modules = [node.args[0].value]
            elif name and matches_any(name, forbidden_calls):
                found.append(f"calls {name}()")
        for module in modules:
            banned = _covered(module, forbidden_modules)
            if banned is not None:
                found.append(f"imports {banned}")
    return list(dict.fromkeys(found))


class SubprocessSandbox(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Refuse code-running tool calls that exceed the sandbox policy; clamp their time limit."""

    name: ClassVar[str] = "subprocess_sandbox"
    _order: ClassVar[int] = PRE
    dimension: ClassVar[str] = "D5"

    tools: tuple[str, ...] = ("run_python",)
    """Names (shell globs) of the tools whose calls carry code."""
    code_field: str = "code"
    """The input field holding the code."""
    max_code_chars: int = 20_000
    max_timeout_s: float = 30.0
    """A larger requested ``timeout_s`` is lowered to this."""
    forbidden_modules: tuple[str, ...] = DEFAULT_FORBIDDEN_MODULES
    """Modules (and their submodules) code may not import."""
    forbidden_calls: tuple[str, ...] = DEFAULT_FORBIDDEN_CALLS
    """Dotted call names (shell globs) code may not call."""

    def __post_init__(self) -> None:
        if self.max_code_chars < 1 or self.max_timeout_s <= 0:
            raise ValueError("max_code_chars and max_timeout_s must be positive")
        self._refusals = Refusals()

    async def process(self, event: BeforeTool | AfterTool) -> AsyncIterator[BeforeTool | AfterTool]:
        """Check a code call before it runs; explain a refusal after."""
        if isinstance(event, AfterTool):
            yield self._refusals.explain(event)
            return
        if not event.approved or not matches_any(event.call.name, self.tools):
            yield event
            return
        code = event.call.input.get(self.code_field)
        if not isinstance(code, str):
            yield event  # the tool itself reports a missing or malformed argument
            return
        if len(code) > self.max_code_chars:
            yield self._refusals.refuse(event, f"the sandbox policy allows at most {self.max_code_chars} "
                                               f"characters of code per call ({len(code)} given)")
            return
        violations = code_violations(code, self.forbidden_modules, self.forbidden_calls)
        if violations:
            yield self._refusals.refuse(event, "the sandbox policy forbids code that " + ", ".join(violations))
            return
        asked = event.call.input.get("timeout_s")
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > self.max_timeout_s:
            call = msgspec.structs.replace(event.call, input={**event.call.input, "timeout_s": self.max_timeout_s})
            event = msgspec.structs.replace(event, call=call)
        yield event
