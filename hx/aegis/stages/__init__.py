"""The stages of an AEGIS round, one module each, and today's pipeline (``pipeline``).

``pipeline(...)`` lists the round in order; the pluggable pieces (an LLM critic and prose,
the code sandbox, an approver, co-evolution's resting tasks) are parameters of the stages
that use them. To add a stage: one module implementing ``hx.aegis.stage.Stage``, and one
entry in the list a run is given (``Parts.stages`` appends after this pipeline).
"""

from __future__ import annotations

from typing import Any

from hx.aegis.digester import ProseWriter
from hx.aegis.gate import CodeCheck, SuiteCheck
from hx.aegis.stage import CodeSource, Stage
from hx.aegis.stages.approved import ShipApproved
from hx.aegis.stages.criticise import CriticFn, Criticise
from hx.aegis.stages.decide import Decide
from hx.aegis.stages.digest import Digest
from hx.aegis.stages.gating import Approver, GateAndShip
from hx.aegis.stages.model import ModelInForce
from hx.aegis.stages.plan import Plan
from hx.aegis.stages.propose import Propose
from hx.aegis.stages.rollouts import Resting, Rollouts


def pipeline(*, critic: CriticFn | None = None, prose: ProseWriter | None = None, code_check: CodeCheck | None = None,
             code_source: CodeSource | None = None, approver: Approver | None = None,
             resting: Resting | None = None, suite_check: SuiteCheck | None = None) -> list[Stage[Any]]:
    """Today's round: approved ships, model in force, rollouts, digest, plan, propose, criticise, gate and ship,
    decide."""
    return [ShipApproved(), ModelInForce(), Rollouts(resting), Digest(prose), Plan(), Propose(code_check),
            Criticise(critic, code_check), GateAndShip(code_check, code_source, approver, suite_check), Decide()]
