"""From an evolver's ``Proposal`` to the ledger's ``CandidateProposed``: derived fields, and whether it builds.

The evolver states intent (operations, code, manifest); everything else a candidate
records is derived here from the variant's harness, so no evolver can misstate it: its
buckets, dimensions and risk, the base digest, and the digest of the harness it builds
(or the reason it does not). A candidate with new code is built in the sandbox by the
gate's ``CodeCheck``, never in this process.
"""

from __future__ import annotations

from hx.aegis.evolvers.base import Proposal
from hx.aegis.gate import CodeCheck
from hx.aegis.operations import buckets_of, dimensions_of, risk_of
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from schemas.ledger import CandidateProposed


async def candidate_of(proposal: Proposal, base: HarnessConfig, *, run_id: str, round: int, candidate: str,
                       evolver: str, code_check: CodeCheck | None) -> CandidateProposed:
    """The ledger record of a proposal on ``base``; a build failure is recorded in it, not raised."""
    digest, error = await _build(proposal, base, run_id, candidate, evolver, code_check)
    return CandidateProposed(
        run_id=run_id, round=round, candidate=candidate, variant=proposal.variant, evolver=evolver,
        operations=proposal.operations, buckets=buckets_of(proposal.operations),
        dimensions=dimensions_of(proposal.operations, base), manifest=proposal.manifest, base_digest=base.digest,
        digest=digest, code=proposal.code, risk=risk_of(proposal.operations, new_code=bool(proposal.code)),
        build_error=error)


async def _build(proposal: Proposal, base: HarnessConfig, run_id: str, candidate: str, evolver: str,
                 code_check: CodeCheck | None) -> tuple[str, str]:
    """The candidate harness's digest, or the reason it does not build."""
    if proposal.code:
        if code_check is None:
            return "", "new code and no sandbox configured to build it"
        probe = CandidateProposed(run_id=run_id, round=-1, candidate=candidate, variant=proposal.variant,
                                  evolver=evolver, operations=proposal.operations, buckets=(),
                                  manifest=proposal.manifest, base_digest=base.digest, digest="", code=proposal.code)
        digest, config_error, _ = await code_check(base, probe)
        return digest, config_error
    try:
        return apply(base, proposal.operations).digest, ""
    except CompositionError as exc:
        return "", str(exc)
