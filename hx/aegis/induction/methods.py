"""The induction methods: each reads the indexed attempts and returns the rules its evidence supports.

Candidate patterns come from the recorded actions only: an action's leading word, optionally
with its last word (``press … panel``), optionally qualified by whether what it names appears in
some text the attempt read (the task, the last observation, what one kind of action showed).
Each method scores every candidate over every recorded step with the interpreter's semantics:

- ``fatal``: actions that ended an attempt in failure become ``avoid`` rules, when the pattern
  blocks at least ``min_support`` such attempts and at most ``max_against`` (a fraction of them)
  steps that raised the score; among the qualifiers of a pattern, the one blocking the fewest
  other steps wins (the least general rule that explains the failures);
- ``rising``: actions that raised the score become ``prefer`` rules, when steps that followed the
  preference raised the score ``min_lift`` times as often as steps that did not, and failed no
  more often; ``order`` tries the same with the least or the most number among the matches;
- ``precedence``: a fatal pattern that raised the score only after some other kind of action was
  taken becomes ``require_before``;
- ``repeat``: actions that, taken again, showed exactly what they showed before and never raised
  the score become ``forbid_repeat``.

Nothing here names a benchmark, a game, a task or an action: every word in a rule comes from
the traces, and every threshold from ``InductionSettings``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from hx.aegis.induction.index import Corpus, Indexed, StepRef, head, text_key
from hx.aegis.induction.traces import Step
from hx.aegis.settings import InductionSettings
from hx.processors._rule_view import FUNCTION_WORDS, number_in, words
from schemas.edits import Anchor
from schemas.rules import (
    AnyText,
    Avoid,
    ForbidRepeat,
    LastObservation,
    Order,
    Pattern,
    Prefer,
    RequireBefore,
    Rule,
    RuleSupport,
    Says,
    ShownAfter,
    TaskText,
)


@dataclass(frozen=True)
class Induced:
    """A rule the traces support: what it rests on, the tasks it should flip, where the evidence is."""

    rule: Rule
    support: RuleSupport
    tasks: tuple[str, ...]
    anchors: tuple[Anchor, ...]
    weight: float


def bases(action: str) -> list[Pattern]:
    """The unqualified patterns an action suggests: its leading word, and that with its last word."""
    toks = words(action)
    if not toks:
        return []
    out = [Pattern(starts=toks[0])]
    if len(toks) >= 3 and toks[-1] not in FUNCTION_WORDS:
        out.append(Pattern(starts=toks[0], mentions=(toks[-1],)))
    return out


def texts(corpus: Corpus, min_support: int) -> list[AnyText]:
    """The texts a qualifier may read: the task, the last observation, and what each common kind of action
    showed (kinds taken in at least ``min_support`` attempts)."""
    shown = [ShownAfter(action=Pattern(starts=kind)) for kind, refs in sorted(corpus.taken.items())
             if kind and len(_tasks(refs)) >= min_support]
    return [TaskText(), LastObservation(), *shown]


def qualified(base: Pattern, options: list[AnyText]) -> Iterator[Pattern]:
    """The base pattern, and it qualified by each text (named in it, or not)."""
    yield base
    for text in options:
        yield Pattern(starts=base.starts, mentions=base.mentions, named_in=text)
        yield Pattern(starts=base.starts, mentions=base.mentions, not_named_in=text)


def _blocks(a: Indexed, pattern: Pattern, t: int) -> bool:
    """The pattern would hold back step ``t``'s action: it matches it and leaves something else on offer."""
    step = a.trace.steps[t]
    if not a.matches(pattern, step.action, t):
        return False
    if a.offer_size(t) > len(a.offered(pattern, t)):
        return True  # an action of another kind is on offer
    return any(o != step.action and not a.matches(pattern, o, t) for o in step.offered)


def _attempts(refs: Iterable[StepRef]) -> set[tuple[int, str, int]]:
    return {a.trace.key for a, _ in refs}


def _tasks(refs: Iterable[StepRef]) -> set[str]:
    return {a.trace.task for a, _ in refs}


def _support(method: str, refs: list[StepRef], against: int) -> RuleSupport:
    keys = _attempts(refs)
    return RuleSupport(method=method, attempts=len(keys), tasks=len({k[1] for k in keys}), steps=len(refs),
                       against=against)


def _anchors(refs: list[StepRef], limit: int = 8) -> tuple[Anchor, ...]:
    return tuple(a.trace.steps[t].anchor for a, t in refs[:limit])


def _failing_tasks(refs: Iterable[StepRef]) -> tuple[str, ...]:
    return tuple(sorted({a.trace.task for a, _ in refs if not a.trace.passed}))


def _by_base(refs: list[StepRef]) -> dict[Pattern, list[StepRef]]:
    out: dict[Pattern, list[StepRef]] = {}
    for a, t in refs:
        for b in bases(a.trace.steps[t].action):
            out.setdefault(b, []).append((a, t))
    return dict(sorted(out.items(), key=lambda kv: (kv[0].starts, kv[0].mentions)))


def _evidenced(pattern: Pattern, refs: list[StepRef], s: InductionSettings) -> bool:
    """The pattern still matches the evidence of ``min_support`` attempts (a cheap test before the full pass)."""
    return len(_tasks(r for r in refs if r[0].matches(pattern, r[0].trace.steps[r[1]].action, r[1]))) \
        >= s.min_support


def _cues(refs: list[StepRef], s: InductionSettings, limit: int = 8) -> list[str]:
    """Words of the last observation before the evidence steps, shared by at least ``min_support`` tasks' steps
    (the most common first): what the state said when the action went wrong."""
    tasks: dict[str, set[str]] = {}
    for a, t in refs:
        for w in a.last[t]:
            if w not in FUNCTION_WORDS and not w.isdigit():
                tasks.setdefault(w, set()).add(a.trace.task)
    shared = [(len(ts), w) for w, ts in tasks.items() if len(ts) >= s.min_support]
    return [w for _, w in sorted(shared, key=lambda nw: (-nw[0], nw[1]))[:limit]]


def _avoidance(corpus: Corpus, pattern: Pattern, cue: str, s: InductionSettings
               ) -> tuple[tuple[int, int, int], Induced] | None:
    """How an ``avoid`` of ``pattern`` (when the last observation says ``cue``, if given) fares on the steps."""
    covered, against, other = [], 0, 0
    for a, t in corpus.taking(pattern):
        if (cue and cue not in a.last[t]) or not _blocks(a, pattern, t):
            continue
        step = a.trace.steps[t]
        if step.fatal:
            covered.append((a, t))
        elif step.rose:
            against += 1
        else:
            other += 1
    n = len(_tasks(covered))
    if n < s.min_support or against > s.max_against * n:
        return None
    when = (Says(text=LastObservation(), words=(cue,)),) if cue else ()
    tasks = _failing_tasks(covered)
    return (n, -against, -other), Induced(Rule(do=Avoid(what=pattern), when=when),
                                          _support("fatal", covered, against), tasks, _anchors(covered),
                                          float(len(tasks)))


def _supported(corpus: Corpus, s: InductionSettings, evidence: Callable[[Step], bool]
               ) -> Iterator[tuple[Pattern, list[StepRef]]]:
    """Each base pattern of the steps ``evidence`` picks, with those steps, when they come from ``min_support`` tasks
    or more."""
    picked = [(a, t) for a in corpus.attempts for t, step in enumerate(a.trace.steps) if evidence(step)]
    for base, refs in _by_base(picked).items():
        if len(_tasks(refs)) >= s.min_support:
            yield base, refs


def fatal(corpus: Corpus, s: InductionSettings) -> list[Induced]:
    """Avoid what ended attempts in failure, qualified as narrowly as the evidence allows: by a text the action
    must (not) name, or else by a word the last observation said before it went wrong."""
    options = texts(corpus, s.min_support)
    out = []
    for base, refs in _supported(corpus, s, lambda step: step.fatal):
        judged = [_avoidance(corpus, p, "", s) for p in qualified(base, options) if _evidenced(p, refs, s)]
        found = [j for j in judged if j is not None]
        if not found:  # no qualifier separates the failures from the successes: try what the state said
            found = [j for cue in _cues(refs, s) if (j := _avoidance(corpus, base, cue, s)) is not None]
        if found:
            out.append(max(found, key=lambda j: j[0])[1])
    return out


QUALIFIER_GAIN = 1.25
"""How much more a qualified preference must lift than the best simpler one to be preferred to it."""

Row = tuple[Indexed, int, list[str]]
"""A step that offered actions of a base pattern: its attempt, its index, the offered actions the base matches."""


def _rows(corpus: Corpus, base: Pattern) -> list[Row]:
    """The steps offering an action the base pattern matches, with those actions (computed once per base)."""
    out = []
    for a, t in corpus.offering_kind(base):
        matched = [o for o in a.offered(base, t) if a.matches(base, o, t)]
        if matched:
            out.append((a, t, matched))
    return out


def _kept(a: Indexed, matched: list[str], pattern: Pattern, order: Order, t: int) -> list[str]:
    named, other = pattern.named_in, pattern.not_named_in
    kept = matched
    if named is not None:
        key = text_key(named)
        kept = [o for o in kept if a.known(key, named, o, pattern.starts, t)]
    if other is not None:
        key = text_key(other)
        kept = [o for o in kept if not a.known(key, other, o, pattern.starts, t)]
    if order and kept:
        numbered = [(n, o) for o in kept if (n := number_in(o)) is not None]
        if numbered:
            best = (min if order == "least" else max)(n for n, _ in numbered)
            kept = [o for n, o in numbered if n == best]
    return kept


def _lift(rows: list[Row], pattern: Pattern, order: Order,
          s: InductionSettings) -> tuple[float, list[StepRef], list[StepRef]] | None:
    """(lift, useful steps that followed, failing attempts' steps that diverged) of preferring ``pattern`` (a
    qualification of the base the rows were made for), or None when the evidence does not bear it out.

    Where the preference would narrow the offer, a step *followed* it when its action was among those kept. The
    lift is how much more often followed steps were useful (raised the score or enabled a step that did) than
    the others; a preference whose followed steps ended attempts in failure more often than steps at large is
    refused, however useful.
    """
    followed_useful: list[StepRef] = []
    diverged: list[StepRef] = []
    f_n = f_fatal = d_n = d_useful = d_fatal = 0
    for a, t, matched in rows:
        kept = _kept(a, matched, pattern, order, t)
        if not kept or len(kept) >= a.offer_size(t):
            continue
        step = a.trace.steps[t]
        if step.action in kept:
            f_n += 1
            f_fatal += step.fatal
            if step.useful:
                followed_useful.append((a, t))
        else:
            d_n += 1
            d_useful += step.useful
            d_fatal += step.fatal
            if not a.trace.passed:
                diverged.append((a, t))
    if len(_tasks(followed_useful)) < s.min_support or not f_n:
        return None
    lift = ((len(followed_useful) + 1) / (f_n + 2)) / ((d_useful + 1) / (d_n + 2))
    if lift < s.min_lift or (f_fatal and f_fatal / f_n > (f_fatal + d_fatal) / (f_n + d_n)):
        return None
    return lift, followed_useful, diverged


def _narrows(rows: list[Row], pattern: Pattern) -> bool:
    """The qualified pattern keeps fewer actions than its base at some of these steps (else, on the evidence,
    it is the base under another name and not worth weighing)."""
    return any(not a.qualifies(pattern, o, t) for a, t, matched in rows for o in matched)


class _Preferences:
    """The best preference of one base pattern per order, its qualified forms judged against the plain one."""

    def __init__(self, base: Pattern, rows: list[Row], s: InductionSettings) -> None:
        self.base, self.rows, self.s = base, rows, s
        self.found: dict[Order, tuple[float, Induced]] = {}
        self.plain: dict[Order, float] = {}
        self.unordered: dict[Pattern, float] = {}

    def judge(self, pattern: Pattern, order: Order) -> None:
        """Weigh preferring ``pattern`` (in ``order``); keep it when it is the best so far."""
        judged = _lift(self.rows, pattern, order, self.s)
        if judged is None:
            return
        lift, followed, diverged = judged
        if pattern == self.base:
            self.plain[order] = lift
        # Occam: a qualifier must earn its place, lifting clearly more than the plain pattern does.
        elif lift <= self.plain.get(order, 0.0) * QUALIFIER_GAIN:
            return
        if order:  # and so must an order, over the same pattern unordered
            if lift <= self.unordered.get(pattern, 0.0) * QUALIFIER_GAIN:
                return
        else:
            self.unordered[pattern] = lift
        if order not in self.found or lift > self.found[order][0]:
            tasks = _failing_tasks(diverged)
            self.found[order] = lift, Induced(Rule(do=Prefer(what=pattern, order=order)),
                                              _support("order" if order else "rising", followed, 0), tasks,
                                              _anchors(followed), len(tasks) * min(lift, 10.0) / 10.0)

    def best(self) -> Pattern | None:
        """The pattern of the best unordered preference (None: none holds)."""
        effect = self.found[""][1].rule.do if "" in self.found else None
        return effect.what if isinstance(effect, Prefer) else None


def rising(corpus: Corpus, s: InductionSettings) -> list[Induced]:
    """Prefer what raised the score or led to it, when following the preference pays; and the least or most
    number first."""
    options = texts(corpus, s.min_support)
    out = []
    for base, refs in _supported(corpus, s, lambda step: step.useful):
        rows = _rows(corpus, base)
        search = _Preferences(base, rows, s)
        useful = [row for row in rows if row[0].trace.steps[row[1]].useful]
        for pattern in qualified(base, options):
            if pattern == base or (_evidenced(pattern, refs, s) and _narrows(useful, pattern)):
                search.judge(pattern, "")
        if any(number_in(a.trace.steps[t].action) is not None for a, t in refs):
            best = search.best()  # an order is tried on the plain pattern and on the best qualified one only
            for order in ("least", "most"):
                search.judge(base, order)
                if best is not None and best != base:
                    search.judge(best, order)
        out += [induced for _, induced in search.found.values()]
    return out


def precedence(corpus: Corpus, s: InductionSettings) -> list[Induced]:
    """Require another kind of action first, where the fatal kind raised the score only after it."""
    kinds = sorted(k for k, refs in corpus.taken.items() if k and len(_tasks(refs)) >= s.min_support)
    out = []
    for base, _ in _supported(corpus, s, lambda step: step.fatal):
        if base.mentions:
            continue
        steps = corpus.taking(base)
        for kind in kinds:
            if kind == base.starts:
                continue
            covered, against, after_rose = [], 0, 0
            for a, t in steps:
                step = a.trace.steps[t]
                if a.first_taken_kind(kind) < t:
                    after_rose += step.rose
                elif _blocks(a, base, t):
                    if step.fatal:
                        covered.append((a, t))
                    elif step.rose:
                        against += 1
            n = len(_tasks(covered))
            if n < s.min_support or against > s.max_against * n or not after_rose:
                continue
            tasks = _failing_tasks(covered)
            out.append(Induced(Rule(do=RequireBefore(first=Pattern(starts=kind), then=base)),
                               _support("precedence", covered, against), tasks, _anchors(covered), float(len(tasks))))
    return out


def repeat(corpus: Corpus, s: InductionSettings) -> list[Induced]:
    """Never repeat a kind of action whose repeats showed nothing new and never raised the score."""
    dull: dict[str, list[StepRef]] = {}
    fresh: Counter[str] = Counter()
    for a in corpus.attempts:
        shown: dict[str, str] = {}
        for t, step in enumerate(a.trace.steps):
            kind = head(step.action)
            before = shown.get(step.action)
            shown[step.action] = step.observation
            if before is None:
                continue
            if before == step.observation and not step.rose:
                dull.setdefault(kind, []).append((a, t))
            else:
                fresh[kind] += 1
    out = []
    for kind, refs in sorted(dull.items()):
        failing = [(a, t) for a, t in refs if not a.trace.passed]
        n = len(_tasks(failing))
        if not kind or n < s.min_support or fresh[kind] > s.max_against * len(refs):
            continue
        tasks = _failing_tasks(failing)
        out.append(Induced(Rule(do=ForbidRepeat(what=Pattern(starts=kind))), _support("repeat", failing, fresh[kind]),
                           tasks, _anchors(failing), 0.5 * len(tasks)))
    return out


METHODS = (fatal, rising, precedence, repeat)
"""Every induction method, in the order their rules are weighed when weights tie."""
