"""A round's tokens: the meta-model's per stage and the task agent's per task, read from what the round cites.

The task agent's figures come from the ``RoundFinished`` of the trace rounds the round cites
(its main rollouts, its gate evaluations and their retries: the attempts ``RoundMetrics.rollouts``
counts), which record every attempt's usage on the round's own subject, so no attempt frame is
opened. The meta-model's come from the ``model.response`` events of its calls in the evolution
round, one subject per stage (``hx.trace.<run>.<round>.aegis:<stage>.*``): the cost follows the
round's own calls, never the run's whole trace.

>>> from schemas.lifecycle import AttemptMark, RoundFinished
>>> fin = RoundFinished(run_id="r", round=3, attempts=1, outcomes=(
...     AttemptMark(task_id="t", attempt=0, passed=True, usage=Usage(input_tokens=10, output_tokens=5)),),
...     usage=Usage(input_tokens=10, output_tokens=5))
>>> tokens = round_tokens([fin], {"evolver": Usage(input_tokens=4200, output_tokens=380)})
>>> tokens.agent.input_tokens, tokens.tasks["t"].output_tokens, tokens.meta["critic"].input_tokens
(10, 5, 0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hx.aegis.meta import META_STAGES
from hx.replay.trace_rounds import read_decoded
from schemas.ledger import RoundTokens
from schemas.lifecycle import RoundFinished
from schemas.messages import Usage, summed
from schemas.model import ModelResponse
from streams.log import EventLog
from streams.topology import TRACE, token_value, trace_filter


async def meta_tokens(log: EventLog, run: str, round: int) -> dict[str, Usage]:
    """Stage -> the usage of its meta-model calls in evolution round ``round`` (every stage, zeros if none)."""
    out = {stage: Usage() for stage in META_STAGES}
    subjects = [trace_filter(run, round, f"aegis:{stage}") for stage in META_STAGES]
    async for r in read_decoded(log, TRACE.name, subjects, [ModelResponse.TYPE],
                                what=f"the meta-model calls of run {run!r} round {round}"):
        stage = token_value(r.subject.split(".")[4]).removeprefix("aegis:")
        if isinstance(r.event, ModelResponse) and stage in out:
            out[stage] = out[stage].plus(r.event.usage)
    return out


def round_tokens(finished: Iterable[RoundFinished], meta: Mapping[str, Usage]) -> RoundTokens:
    """The round's figures from its cited trace rounds' ends and its stages' meta-model usage."""
    ends = list(finished)
    tasks: dict[str, Usage] = {}
    for fin in ends:
        for mark in fin.outcomes:
            tasks[mark.task_id] = tasks.get(mark.task_id, Usage()).plus(mark.usage)
    return RoundTokens(meta={s: meta.get(s, Usage()) for s in META_STAGES}, agent=summed(f.usage for f in ends),
                       tasks=dict(sorted(tasks.items())))
