"""Generality as a test: the code that learns rules and runs them names no game, no task and no game word.

The names and the words are read from the environments themselves (every TextWorldExpress game
and ScienceWorld task, their task descriptions), not from a list kept here; only everyday
English that the code uses in its own sense is set apart.
"""

from __future__ import annotations

import re
from pathlib import Path

from scienceworld import ScienceWorldEnv
from textworld_express import TextWorldExpressEnv

from hx.environments.twx import GAME_OPTIONS

ROOT = Path(__file__).resolve().parent.parent

GUARDED = (*sorted((ROOT / "hx" / "aegis" / "induction").glob("*.py")),
           ROOT / "hx" / "aegis" / "evolvers" / "induced.py", ROOT / "hx" / "aegis" / "evolvers" / "composite.py",
           ROOT / "hx" / "processors" / "rule_program.py", ROOT / "hx" / "processors" / "_rule_view.py")
"""The code that learns rules and runs them: what it knows of any game is a generality bug."""

ENGLISH = frozenset((
    "a", "about", "above", "after", "all", "also", "an", "and", "are", "as", "at", "be", "been", "by", "can",
    "do", "does", "each", "first", "for", "found", "from", "has", "have", "if", "in", "into", "is", "it", "its",
    "may", "more", "most", "next", "not", "of", "on", "once", "one", "or", "same", "some", "than", "that",
    "the", "their", "them", "then", "there", "this", "to", "two", "until", "up", "was", "what", "when",
    "whether", "which", "will", "with", "without", "your",
    "actions", "check", "completed", "environment", "exactly", "game", "item", "longest", "move", "part",
    "place", "point", "read", "repeat", "require", "says", "search", "state", "task", "turn", "unknown", "use",
))
"""Words some task description has that the guarded code also uses, in their everyday sense (``read``, ``says``,
``repeat``, ``require`` and ``state`` name the rule language's own texts, conditions and effects; ``longest`` and
``unknown`` are halves of ``zip_longest`` and ``forbid_unknown_fields``). Words of a game's own vocabulary
(``box``, ``take``, ``put``, its objects and places) are never here."""

_IDENTIFIER_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def code_words(text: str) -> set[str]:
    """The words of code and prose alike: identifiers split at underscores and capitals, lower-cased."""
    return {w.lower() for w in _IDENTIFIER_PART.findall(text)}


def game_texts() -> tuple[list[str], list[str]]:
    """(the names of every TextWorldExpress game and ScienceWorld task, their task descriptions), read from the
    environments themselves (five seeds of each game, the first variation of each task)."""
    names: list[str] = []
    descriptions: list[str] = []
    twx = TextWorldExpressEnv(envStepLimit=100)
    try:
        for game in twx.getGameNames():
            names.append(game)
            twx.load(game, ",".join(f"{k}={v}" for k, v in GAME_OPTIONS.get(game, {}).items()))
            descriptions += [twx.reset(seed=seed, gameFold="train")[1]["taskDescription"] for seed in range(5)]
    finally:
        twx.close()
    sciworld = ScienceWorldEnv("", envStepLimit=100)
    try:
        for task in sciworld.get_task_names():
            names.append(task)
            sciworld.load(task, 0, "easy", generateGoldPath=False)
            descriptions.append(sciworld.get_task_description())
    finally:
        sciworld.close()
    return names, descriptions


def test_the_code_that_learns_and_runs_rules_names_no_game_task_or_game_word() -> None:
    """No game or task name, and no word of any game's task description that is not everyday English, appears in
    the induction, the induced evolver, the composite evolver or the interpreter: code, comments and docstrings."""
    names, descriptions = game_texts()
    assert len(names) == 8 + 30 and len(descriptions) == 8 * 5 + 30
    words = {w for d in descriptions for w in code_words(d) if len(w) > 1 and not w.isdigit()}
    assert {"coin", "kitchen", "box", "thermometer", "focus"} <= words  # the descriptions were read, and in full
    game_words = words - ENGLISH
    found = []
    for path in GUARDED:
        text = path.read_text()
        for name in names:  # hyphenated task names also as identifiers or plain words
            if re.search(r"\b" + re.sub(r"[-_ ]", "[-_ ]?", re.escape(name)) + r"\b", text, re.IGNORECASE):
                found.append(f"{path.relative_to(ROOT)}: {name}")
        found += [f"{path.relative_to(ROOT)}: {w}" for w in sorted(code_words(text) & game_words)]
    assert not found, found
    assert len(GUARDED) == 8
