"""The LLM evolver: a meta-model proposes typed candidates, hx checks and grounds them.

``propose`` asks the meta-model once (through ``MetaAgent``, so the call is on the log)
with the round's landscape, the failing digests, every live variant's harness, the
processor catalog and the reply format (``prompts``). The reply is parsed strictly
(``reply``): one that does not parse raises ``EvolverReplyError`` naming the place. Each
candidate is then checked on its own, and one that fails is skipped with the reason in
``notes`` (the loop writes them into the round's decision):

- the variant is live, the operations name library processors or the candidate's own new
  code, no banned lever is pulled, and operations without new code compose on the variant;
- new code is parsed (never imported) and put in the ``CodeStore``; operations and the
  attribution that name it by file or class are rewritten to its content-derived name;
- the manifest's evidence anchors are taken from the digests of its predicted flips:
  the model is never trusted with log positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

import msgspec

import hx.processors  # noqa: F401 - the catalog lists the library processors, registered on import
from hx.aegis import levers
from hx.aegis.errors import EvolverError
from hx.aegis.evolvers.base import Context, Evolver, Proposal, evidence_for, judged
from hx.aegis.evolvers.prompts import SYSTEM, propose_prompt, revise_prompt
from hx.aegis.evolvers.reply import WireCandidate, WireCode, WireReply, parse
from hx.aegis.meta import MetaAgent
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harness.processor import registered
from hx.runtime.code import CodeStore, Declared, declared_processor, module_name, source_digest
from hx.runtime.errors import CodeError, ProviderError
from projections.ledger_records import lever_of
from schemas.edits import Attach, CodeAsset, Manifest, Replace
from schemas.messages import Message


class _Skip(Exception):
    """One candidate is invalid (the reply as a whole still stands)."""


def _references(file: str, declared: Declared) -> set[str]:
    """The ways a reply may name a new processor: file name, stem, class, ``file:Class``, its own name."""
    stem = PurePath(file).stem
    return {file, stem, declared.cls, f"{file}:{declared.cls}", f"{stem}:{declared.cls}", declared.name}


class LlmEvolver(Evolver):
    """Candidates from a meta-model, checked, grounded in the digests, new code stored by content."""

    name = "llm"

    @classmethod
    def build(cls, *, meta: MetaAgent | None, store: CodeStore | None) -> LlmEvolver:
        """An evolver asking ``meta``; ``EvolverError`` without a meta-model."""
        if meta is None:
            raise EvolverError("the llm evolver needs --meta-model")
        return cls(meta, store)

    def __init__(self, meta: MetaAgent, store: CodeStore | None = None) -> None:
        self.meta = meta
        self.store = store
        self.notes: list[str] = []
        """Why candidates of the last reply were skipped (reset by each ``propose``)."""

    async def _ask(self, stage: str, round: int, prompt: str) -> str:
        messages = (Message(role="system", content=SYSTEM), Message(role="user", content=prompt))
        try:
            completion = await self.meta.complete(stage, round, messages)
        except ProviderError as exc:
            raise EvolverError(f"the meta-model failed: {exc}") from None
        return completion.content

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """Up to ``k`` checked candidates from one meta-model call."""
        self.notes = []
        if k <= 0:
            return []
        reply = parse(await self._ask("evolver", context.round, propose_prompt(context, k, levers.catalog())),
                      WireReply)
        out: list[Proposal] = []
        for i, cand in enumerate(reply.candidates):
            if len(out) >= k:
                self.notes.append(f"candidates[{i}]: beyond the {k} asked for; dropped")
                continue
            try:
                out.append(await self._proposal(context, cand))
            except _Skip as exc:
                self.notes.append(f"candidates[{i}]: {exc}")
        return out

    async def revise(self, context: Context, proposal: Proposal, request: str,
                     supported: Sequence[str]) -> Proposal | None:
        """The meta-model's revision after the critic's request (None when it withdraws or it is invalid)."""
        reply = parse(await self._ask("revise", context.round, revise_prompt(context, proposal, request, supported)),
                      WireReply)
        if not reply.candidates:
            self.notes.append("revision: withdrawn by the meta-model")
            return None
        cand = reply.candidates[0]
        if len(reply.candidates) > 1:
            self.notes.append(f"revision: {len(reply.candidates)} candidates returned; the first is used")
        if cand.variant != proposal.variant:
            self.notes.append(f"revision: variant changed from {proposal.variant!r} to {cand.variant!r}; dropped")
            return None
        try:
            return await self._proposal(context, cand, known=proposal.code, revision=True)
        except _Skip as exc:
            self.notes.append(f"revision: {exc}")
            return None

    async def _proposal(self, context: Context, cand: WireCandidate, known: Sequence[CodeAsset] = (), *,
                        revision: bool = False) -> Proposal:
        """Check one candidate, store its code, rewrite its names, ground its manifest (``_Skip`` when invalid).

        ``known``: code a revised candidate may keep by name; a revision may keep its operations too.
        """
        vstate = context.state.live().get(cand.variant)
        if vstate is None:
            raise _Skip(f"unknown variant {cand.variant!r}; live: {', '.join(sorted(context.state.live()))}")
        if not cand.operations:
            raise _Skip("no operations")
        declared = self._declared(cand.code)
        library = registered()
        # A library name always means the library processor, even if a new file is called the same.
        refs = {ref: d.name for code, d in zip(cand.code, declared, strict=True)
                for ref in _references(code.name, d) if ref not in library}
        refs.update({a.processor: a.processor for a in known})
        groups = {d.name: d.group for d in declared}
        ops = tuple(msgspec.structs.replace(op, processor=refs[op.processor])
                    if isinstance(op, Attach | Replace) and op.processor in refs else op for op in cand.operations)
        used = {op.processor for op in ops if isinstance(op, Attach | Replace)} & set(refs.values())
        for i, op in enumerate(ops):
            if isinstance(op, Attach | Replace) and op.processor not in used and op.processor not in library:
                raise _Skip(f"operations[{i}]: unknown processor {op.processor!r} (neither a library processor nor "
                            f"new code of this candidate)")
            if lever_of(op) in context.landscape.banned:
                raise _Skip(f"operations[{i}]: lever {lever_of(op)!r} is banned this round")
        if not used:
            try:  # library processors only: safe to build here (new code is built only in the sandbox)
                apply(vstate.harness, ops)
            except CompositionError as exc:
                raise _Skip(f"does not build: {exc}") from None
        if not revision and judged(context, cand.variant, ops):
            raise _Skip("the same operations were already judged on this harness under this model")
        assets = [a for a in known if a.processor in used]
        for code, d in zip(cand.code, declared, strict=True):
            if d.name not in used:
                self.notes.append(f"{code.name}: not used by any operation of its candidate; left out")
            elif self.store is not None:
                assets.append(await self.store.put(code.name, code.source))
        m = cand.manifest
        attribution = groups.get(refs.get(m.attribution, ""), m.attribution)
        manifest = Manifest(intended_effect=m.intended_effect, categories=m.categories,
                            predicted_flips=m.predicted_flips, at_risk=m.at_risk,
                            evidence=evidence_for(context.digests, m.predicted_flips),
                            attribution=attribution, capability_evidence=m.capability_evidence,
                            stabilise=m.stabilise, expected_min_calls=m.expected_min_calls,
                            accepted_regressions=m.accepted_regressions)
        return Proposal(cand.variant, ops, manifest, tuple(assets))

    def _declared(self, code: Sequence[WireCode]) -> list[Declared]:
        out = []
        for j, file in enumerate(code):
            if self.store is None:
                raise _Skip("brings new code, but no code store is configured")
            try:
                declared = declared_processor(file.source, module_name(source_digest(file.source)))
            except CodeError as exc:
                raise _Skip(f"code[{j}] ({file.name}): {exc}") from None
            if declared.named:
                raise _Skip(f"code[{j}] ({file.name}): sets `name`; leave it unset so the processor is named by "
                            "its content")
            out.append(declared)
        return out
