"""ModelConfig: which model serves each role, the fallback chain, and the call policy.

Each role (``main``, ``judge``, ``evaluator``, more by name) has a primary model and an
ordered fallback list. A call tries the chain in order: a rate limit, connection or
server error is retried with exponential backoff and then falls back; an
authentication error falls back at once; a context that is too long is raised, since
no other model of the chain is assumed to be larger. Every try is an event.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from hx.harness.config import HarnessConfig
from hx.runtime.errors import ModelSpecError, ProviderError
from hx.runtime.loop import AttemptResult, RunLoop
from hx.runtime.providers.base import check_spec
from hx.runtime.providers.resources import ProviderResources
from hx.runtime.task import Task
from streams.log import EventLog
from streams.redaction import MASK, scrub


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A model per role with a fallback chain per role (the paper's M)."""

    main: str = "random:"
    judge: str | None = None
    evaluator: str | None = None
    roles: dict[str, str] = {}
    """Further roles by name."""
    fallback: dict[str, list[str]] = {}
    """Per role, models tried in order after the primary fails."""
    params: dict[str, dict[str, Any]] = {}
    """Per role, sampling parameters (temperature, max_tokens, seed, logprobs)."""
    provider_options: dict[str, dict[str, Any]] = {}
    """Per model spec, provider options (base URL, scripted completions); never secrets."""
    retries: int = 2
    """Retries of one model on a retryable error before falling back."""
    backoff_s: float = 0.5

    def model_for(self, role: str) -> str:
        """The primary model of a role."""
        model = {"main": self.main, "judge": self.judge, "evaluator": self.evaluator}.get(role) or self.roles.get(role)
        if model is None:
            raise ProviderError("other", f"no model configured for role {role!r}")
        return model

    def chain(self, role: str) -> list[str]:
        """The models tried for a role, in order."""
        return [self.model_for(role), *self.fallback.get(role, [])]

    def params_for(self, role: str) -> dict[str, Any]:
        """Sampling parameters of a role."""
        return dict(self.params.get(role, {}))

    def options_for(self, spec: str) -> dict[str, Any]:
        """Provider options of a model spec."""
        return dict(self.provider_options.get(spec, {}))

    def specs(self) -> list[tuple[str, str]]:
        """(role, model spec) of every model any role may call, primaries and fallbacks, in order."""
        roles = {"main": self.main, "judge": self.judge, "evaluator": self.evaluator, **self.roles}
        return [(role, spec) for role, primary in roles.items() if primary
                for spec in [primary, *self.fallback.get(role, [])]]

    def check(self) -> None:
        """Check every spec without calling a model: provider known, URL well formed, key present.

        Raises ``ModelSpecError`` naming the role and the spec (credentials masked); a role
        with fallbacks but no primary model is an error too.
        """
        orphans = sorted(set(self.fallback) - {role for role, _ in self.specs()})
        if orphans:
            raise ModelSpecError(f"fallback models for role(s) {', '.join(orphans)} that have no model")
        for role, spec in self.specs():
            try:
                check_spec(spec, self.options_for(spec))
            except ModelSpecError as exc:
                raise ModelSpecError(f"role {role}: {exc}") from None

    def public(self) -> ModelConfig:
        """This configuration with credentials masked in every spec: what reports and run events show."""
        def mask(spec: str | None) -> str | None:
            return None if spec is None else scrub(spec)
        return msgspec.structs.replace(
            self, main=scrub(self.main), judge=mask(self.judge), evaluator=mask(self.evaluator),
            roles={k: scrub(v) for k, v in self.roles.items()},
            fallback={k: [scrub(s) for s in v] for k, v in self.fallback.items()},
            provider_options={scrub(k): v for k, v in self.provider_options.items()})

    def agentic(self, harness: HarnessConfig, *, log: EventLog | None = None,
                resources: ProviderResources | None = None) -> Agent:
        """Bind this model configuration to a validated harness: an agent ready to run tasks."""
        return Agent(self, harness.validate(), log=log, resources=resources)


def restore_spec(recorded: str, given: str | None, *, option: str, what: str) -> str:
    """The model spec to call for one a run recorded: ``recorded``, or ``given`` when it masks to exactly ``recorded``.

    What a run records has its credentials masked (``scrub``), so a spec that had any cannot
    reach its server as recorded: ``given`` (the spec passed again as ``option``) brings the
    credentials back, and may change nothing else. ``what`` names the record in errors.

    >>> restore_spec("openai:m@http://***@h/v1", "openai:m@http://me:pw@h/v1", option="--model", what="run r")
    'openai:m@http://me:pw@h/v1'
    """
    if given is None or given == recorded:
        if MASK in recorded:
            raise ModelSpecError(f"{what} recorded {option} {recorded!r} with its credentials masked: pass it "
                                 f"again with them, as {option} SPEC (SPEC must mask to exactly that)")
        return recorded
    if scrub(given) != recorded:
        raise ModelSpecError(f"{option} {scrub(given)!r} differs from the spec {what} recorded, {recorded!r}: "
                             f"{option} may only give back the credentials the record masks")
    return given


class Agent:
    """A harness bound to a model configuration (the paper's H = (M, C)), ready to run tasks."""

    def __init__(self, models: ModelConfig, harness: HarnessConfig, *, log: EventLog | None = None,
                 resources: ProviderResources | None = None) -> None:
        self.models = models
        self.harness = harness
        self.log = log
        self.resources = resources if resources is not None else ProviderResources()
        """Lent to the providers of every run of this agent (its runs share a loaded policy)."""

    async def run(self, task: Task, *, run_id: str | None = None, round: int = 0, attempt: int = 0,
                  seed: int = 0, max_steps: int = 50, timeout_s: float | None = None) -> AttemptResult:
        """Run one attempt at ``task``; every event goes to the log (opened on demand if none was given).

        Without a ``run_id`` the attempt gets a run of its own (``adhoc-<random>``): a run id
        names a run, and reusing one for a new attempt is refused (``AttemptExists``).
        """
        loop = RunLoop(self.models, self.harness, log=self.log, resources=self.resources)
        return await loop.run(task, run_id=run_id or f"adhoc-{uuid.uuid4().hex[:12]}", round=round,
                              attempt=attempt, seed=seed, max_steps=max_steps, timeout_s=timeout_s)
