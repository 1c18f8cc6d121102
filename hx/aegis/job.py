"""What an evolution run is: the command line's request, and the job it becomes, recorded on the run's ledger.

An ``EvolveRequest`` is what ``hx evolve`` (and ``hx coevolve``) was asked: which tasks
(``TaskChoice``: benchmarks, how many adaptation and held-out tasks, the held-out split), the
loop's ``EvolveSettings``, the rollout's ``RolloutSettings``, the models and the evolver. The
job (``EvolveJob``) is that request resolved: the task ids themselves and the initial harness.
It is recorded in ``LedgerOpened.settings`` as nested plain data, so a resumed run
(``hx evolve --resume RUN``), a replay and an export read back the very same job
(``hx.aegis.session.recorded_job``, which also reads the flat shape of runs recorded before jobs were nested).

>>> job = EvolveJob(run_id="r", benches=("mybench:game",), adaptation=(), heldout=(), rollout=RolloutSettings(seed=3))
>>> recorded = job.recorded()
>>> recorded["rollout"]["seed"], recorded["loop"]["rounds"], "coevolve" in recorded
(3, 6, False)
>>> recorded["loop"]["gate"]
{'seesaw': 'sequential', 'drop': 0.25, 'alpha': 0.05, 'waves': 3}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from hx.aegis.settings import EvolveSettings
from hx.environments.rollout import RolloutSettings
from hx.runtime.models import restore_spec
from schemas.harness import HarnessSpec
from streams.redaction import scrub

if TYPE_CHECKING:  # only typed here: the learner brings JAX, which plain evolution runs never load
    from hx.aegis.coevolution import CoevolveSettings


@dataclass(frozen=True)
class TaskChoice:
    """Which tasks a run evolves on and is judged on, before they are resolved to task ids."""

    benches: tuple[str, ...]
    """``benchmark`` or ``benchmark:game`` specs."""
    adaptation: int = 30
    """Adaptation tasks per game (the dev split's first N)."""
    heldout: int = 50
    """Held-out tasks per game (the held-out split's first N)."""
    heldout_split: str = "test"
    """Where the held-out tasks come from: ``test``, or ``train`` as a validation split."""


@dataclass(frozen=True)
class EvolveRequest:
    """What ``hx evolve`` / ``hx coevolve`` was asked for, as one typed value (it never travels: a CLI value)."""

    tasks: TaskChoice
    loop: EvolveSettings = field(default_factory=EvolveSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    model: str | None = None
    """The task agent's model spec; None: the default, or on ``--resume`` the recorded one."""
    meta_model: str = ""
    """The LLM stages' model spec (empty: none)."""
    evolver: str = "offline"
    coevolve: CoevolveSettings | None = None
    """``hx coevolve``'s settings; None: a plain evolution (the model is not trained)."""


class EvolveJob(msgspec.Struct, frozen=True, kw_only=True):
    """What an evolution run is: recorded on its ledger (credentials masked), so a resume rebuilds it exactly."""

    coevolving: ClassVar[bool] = False
    """Whether this is an ``hx coevolve`` job (``hx.aegis.coevolution.CoevolveJob``)."""

    run_id: str
    benches: tuple[str, ...]
    """The ``benchmark`` or ``benchmark:game`` specs the tasks come from."""
    adaptation: tuple[str, ...]
    """Adaptation task ids (evolution works on these)."""
    heldout: tuple[str, ...]
    """The frozen held-out task ids (only ever evaluated)."""
    model: str = "random:"
    harness: HarnessSpec = HarnessSpec()
    """The initial harness."""
    harness_source: str = ""
    evolver: str = "offline"
    meta_model: str = ""
    rollout: RolloutSettings = RolloutSettings()
    """How each rollout runs."""
    loop: EvolveSettings = EvolveSettings()
    """The loop's settings."""

    def recorded(self) -> dict[str, Any]:
        """This job as ``LedgerOpened.settings`` records it: public (``public``), nested plain data, the gate's
        settings as ``GateSettings.recorded`` writes them."""
        data: dict[str, Any] = msgspec.to_builtins(self.public())
        data["loop"]["gate"] = self.loop.gate.recorded()
        return data

    def public(self) -> EvolveJob:
        """This job as it is recorded and shown: credentials in its model specs masked."""
        return msgspec.structs.replace(self, model=scrub(self.model), meta_model=scrub(self.meta_model))

    def restored(self, model: str | None, meta_model: str | None) -> EvolveJob:
        """A recorded job with the credentials of its model specs given back (``restore_spec``); None: none given."""
        what = f"run {self.run_id!r}"
        return msgspec.structs.replace(
            self, model=restore_spec(self.model, model, option="--model", what=what),
            meta_model=restore_spec(self.meta_model, meta_model, option="--meta-model", what=what))
