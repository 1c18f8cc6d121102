r"""New processor code, content-addressed: stored by digest, named by digest, imported only once proven.

An evolver that writes a processor hands its source to ``CodeStore.put``: the bytes go to
the log's object store under ``code/sha256:<hex>`` and the returned ``CodeAsset`` names
the processor the source defines. That name is read off the source with ``ast``, never
by importing it: the one class that subclasses ``Processor`` and defines ``process``,
registered as ``hx_plugin_<first 16 hex of the digest>:<Class>``. The module name comes
from the content, so the same source always gives the same processor name, an
``Attach`` naming it is stable across rounds and runs, and two different sources can
never claim one name.

The invariant: **no candidate's module is imported in the main process before its smoke
test passed.** ``put`` and ``get`` only move bytes; ``hx.aegis.smoke.check`` imports the
code in a sandboxed subprocess; only after it reports ``smoke_ok`` is ``materialize``
called (``hx.aegis.smoke.SandboxCodeCheck`` does it for the gate), which writes
``plugin_dir/hx_plugin_<hex>.py`` and puts ``plugin_dir`` on ``sys.path`` (it imports
nothing). From then on ``processor_type`` finds the class by its ``module:Class`` name, as
it finds any processor. Because a file in ``plugin_dir`` is named by its own digest, its
presence means that very content passed a smoke test.

>>> source = "class Hint(Processor):\n    async def process(self, event):\n        yield event\n"
>>> declared_processor(source, module_name(source_digest(source))).name
'hx_plugin_7193790973d40b5c:Hint'
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hx.runtime.errors import CodeError
from projections.ledger import RunLedger
from schemas.edits import CodeAsset
from streams.log import EventLog
from streams.topology import BLOB_STORE

PLUGIN_PREFIX = "hx_plugin_"
OBJECT_PREFIX = "code/"
_BASE = "Processor"


def source_digest(source: str) -> str:
    """``sha256:<hex>`` over the UTF-8 bytes of ``source``."""
    return bytes_digest(source.encode())


def bytes_digest(data: bytes) -> str:
    """``sha256:<hex>`` over ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def module_name(digest: str) -> str:
    """The plugin module name of a source digest: ``hx_plugin_`` and its first 16 hex digits."""
    hexdigits = digest.removeprefix("sha256:")
    if len(hexdigits) < 16 or any(c not in "0123456789abcdef" for c in hexdigits):
        raise CodeError(f"not a sha256 digest: {digest!r}")
    return PLUGIN_PREFIX + hexdigits[:16]


@dataclass(frozen=True)
class Declared:
    """The processor a source declares, as read from its syntax tree."""

    cls: str
    """The class name."""
    name: str
    """Its registry name: the ``name`` class variable if set, else ``module:Class``."""
    group: str
    """Its singleton group: ``_singleton_group`` if set, else the registry name."""
    named: bool
    """True when the class sets ``name`` itself (the name then does not follow the content)."""


def _bases(node: ast.ClassDef) -> list[str]:
    out = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            out.append(base.id)
        elif isinstance(base, ast.Attribute):
            out.append(base.attr)
    return out


def _string_class_var(node: ast.ClassDef, var: str) -> str:
    """The string constant assigned to ``var`` in the class body ("" when it is not one)."""
    for stmt in node.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        if isinstance(target, ast.Name) and target.id == var and isinstance(value, ast.Constant) \
                and isinstance(value.value, str):
            return value.value
    return ""


def declared_processor(source: str, module: str) -> Declared:
    """The one processor class ``source`` defines (``CodeError`` when there is none, or several)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise CodeError(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    # Subclasses of Processor, also through another class of the same module (in definition order).
    kinds: set[str] = {_BASE}
    for node in classes:
        if any(b in kinds for b in _bases(node)):
            kinds.add(node.name)
    found = [n for n in classes if n.name in kinds and any(
        isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == "process" for s in n.body)]
    if len(found) != 1:
        what = "no class" if not found else f"{len(found)} classes ({', '.join(n.name for n in found)})"
        raise CodeError(f"{what} subclassing Processor with a process() method; exactly one is needed")
    node = found[0]
    own = _string_class_var(node, "name")
    name = own or f"{module}:{node.name}"
    return Declared(cls=node.name, name=name, group=_string_class_var(node, "_singleton_group") or name,
                    named=bool(own))


class CodeStore:
    """Processor sources in the object store, and their plugin modules on disk once proven."""

    def __init__(self, log: EventLog, plugin_dir: Path) -> None:
        self.log = log
        self.plugin_dir = Path(plugin_dir)
        self._verified: dict[str, str] = {}
        """Digest -> source already read and checked (content-addressed: it cannot change)."""

    async def put(self, name: str, source: str) -> CodeAsset:
        """Store ``source`` (file ``name``) by digest and name the processor it defines (no import)."""
        digest = source_digest(source)
        try:
            declared = declared_processor(source, module_name(digest))
        except CodeError as exc:
            raise CodeError(f"{name}: {exc}") from None
        data = source.encode()
        store = await self.log.js.object_store(BLOB_STORE)
        await store.put(OBJECT_PREFIX + digest, data)
        return CodeAsset(name=name, digest=digest, size=len(data), processor=declared.name)

    async def get(self, asset: CodeAsset) -> str:
        """The source of ``asset``, verified against its digest and size (read from the store once)."""
        known = self._verified.get(asset.digest)
        if known is not None and len(known.encode()) == asset.size:
            return known
        # direct gets: an auditor's connection may create no consumer (streams.direct)
        data = await self.log.read_object(BLOB_STORE, OBJECT_PREFIX + asset.digest)
        if data is None:
            raise CodeError(f"{asset.name}: no source stored under {asset.digest}")
        got = bytes_digest(data)
        if got != asset.digest or len(data) != asset.size:
            raise CodeError(f"{asset.name}: stored source does not match its digest {asset.digest} "
                            f"(got {got}, {len(data)} bytes)")
        source = self._verified[asset.digest] = data.decode()
        return source

    def path_of(self, asset: CodeAsset) -> Path:
        """Where ``materialize`` writes the module of ``asset``."""
        return self.plugin_dir / f"{module_name(asset.digest)}.py"

    async def materialize(self, asset: CodeAsset) -> str:
        """Write the module of a smoke-tested ``asset`` under ``plugin_dir`` (idempotent); return its name.

        Call it only after ``hx.aegis.smoke.check`` passed for this code: it makes the
        module importable in this process (it does not import it).
        """
        source = await self.get(asset)
        path = self.path_of(asset)
        if not (path.is_file() and path.read_text() == source):
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the whole module or none
        self.activate()
        return module_name(asset.digest)

    def activate(self) -> None:
        """Put ``plugin_dir`` on ``sys.path`` (a resumed run does this before folding harnesses that name plugins)."""
        entry = str(self.plugin_dir.resolve())
        if entry not in sys.path:
            sys.path.append(entry)  # appended: a plugin module never shadows an installed one
        importlib.invalidate_caches()  # the directory listing may be cached from before a module was written


async def restore_plugins(store: CodeStore, ledger: RunLedger) -> None:
    """Write back the code of every candidate that passed the gate, so the harnesses naming it build here."""
    if not any(c.proposal.code for c in ledger.candidates.values()):
        return  # no new processor code on this ledger: nothing to put on the path
    store.activate()
    for cand in ledger.candidates.values():
        if cand.gate is not None and cand.gate.passed:
            for asset in cand.proposal.code:
                await store.materialize(asset)
