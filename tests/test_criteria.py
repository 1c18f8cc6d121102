"""The criteria library: every kind on a passing and a failing output, with its detail; bad parameters; judging."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hx.eval.criteria import CRITERIA, NoParams, build, criterion, judge
from hx.eval.criteria_documents import outline
from hx.eval.errors import EvalError, UnknownCriterion
from projections.attempt_outputs import AttemptOutput

DOCS = Path(__file__).resolve().parents[1] / "docs" / "criteria.md"

REPORT = """# Context engineering

## 1. Introduction
Why this matters.

## Retrieval
Fetch only what the step needs, for example the last three tool results.

## Compression
Summarise old turns.

```python
## a comment in code, not a heading
# nor this one
summary = compress(history)
```

## Conclusion
That is all.
"""


def doc(text: str, **fields: Any) -> AttemptOutput:
    """An attempt whose output text is ``text`` (its last content)."""
    return AttemptOutput("run-1", 0, "free:report:dev:0", 0, answer=text, **fields)


def attempt(**fields: Any) -> AttemptOutput:
    """A finished attempt with the given fields."""
    return AttemptOutput("run-1", 0, "twx:coin:dev:0", 0, **{"finished": True, "status": "completed", **fields})


def verdict(name: str, params: dict[str, Any], out: AttemptOutput) -> tuple[bool, str]:
    return judge(build(name, params, where="suite task 't'"), out)


# (criterion, params, passing output, its detail, failing output, its detail)
CASES: list[tuple[str, dict[str, Any], AttemptOutput, str, AttemptOutput, str]] = [
    # --- documents
    ("min_bytes", {"n": 5}, doc("héllo"), "6 bytes (need >= 5)", doc("hey"), "3 bytes (need >= 5)"),
    ("min_lines", {"n": 3}, doc("a\n\nb\nc\n"), "3 non-blank lines (need >= 3)",
     doc("a\n \n\nb"), "2 non-blank lines (need >= 3)"),
    ("exact_sections", {"n": 2}, doc(REPORT),
     "2 content sections (need exactly 2): 'Retrieval', 'Compression'; structural, not counted: "
     "'1. Introduction', 'Conclusion'",
     doc("## Overview\n## II. Summary\n## **Only one**\n### Deeper\n"),
     "1 content sections (need exactly 2): '**Only one**'; structural, not counted: 'Overview', 'II. Summary'"),
    ("min_sections", {"n": 2}, doc("## A\n## B\n## C"), "3 content sections (need >= 2): 'A', 'B', 'C'",
     doc("## Background\n## A\n##B\n#### C"), "1 content sections (need >= 2): 'A'; structural, not counted: "
                                             "'Background'"),
    ("no_placeholders", {}, doc(REPORT + "A todo list app."), "no placeholder text",
     doc("## Step\nTODO\nThen [insert example here].\nFIXME later"),
     "placeholder text found: 'TODO' (line 2), '[insert example here]' (line 3), 'FIXME' (line 4)"),
    ("no_placeholders", {"extra": ["to be written"]}, doc("done"), "no placeholder text",
     doc("Intro.\nSection To Be Written."), "placeholder text found: 'To Be Written' (line 2)"),
    ("has_examples", {}, doc("```\nx = 1\n```\n~~~\ny\n~~~"), "2 code blocks",
     doc("# Plain\nNothing concrete here, **exampled** nowhere."),
     "no example: no code block, no example label, none of 'for example', 'for instance', 'e.g.', 'example:', "
     "'examples:', 'implementation note'"),
    ("has_examples", {}, doc("Use caching,\ne.g. an LRU."), "example phrase 'e.g.' (line 2)",
     doc("Use caching, eg an LRU."), "no example: no code block, no example label, none of 'for example', "
                                     "'for instance', 'e.g.', 'example:', 'examples:', 'implementation note'"),
    ("has_examples", {}, doc("```\nunclosed: a code block to the end"), "1 code block",
     doc("**Examplee** x"), "no example: no code block, no example label, none of 'for example', 'for instance', "
                           "'e.g.', 'example:', 'examples:', 'implementation note'"),
    ("has_examples", {}, doc("**Examplee** x\n`for example` in code: ```not a fence```"),
     "example phrase 'for example' (line 2)", doc("`for` example"),
     "no example: no code block, no example label, none of 'for example', 'for instance', 'e.g.', 'example:', "
     "'examples:', 'implementation note'"),
    ("has_examples", {}, doc("### Examples\nsee below"), "example label 'examples'",
     doc(""), "no example: no code block, no example label, none of 'for example', 'for instance', 'e.g.', "
              "'example:', 'examples:', 'implementation note'"),
    ("no_path_narration", {}, doc("Stored in memory, written in Python, saved 3.5 GB.\n```\nsaved to ~/x.md\n```"),
     "no path narration", doc("# Report\nDone.\nI have saved the final report to ~/Desktop/report.md."),
     "narrates a file's path: 'saved the final report to ~/Desktop/report.md' (line 3)"),
    ("no_path_narration", {}, doc("See the docs at https://example.org."), "no path narration",
     doc("The results were written to /tmp/out/results.csv"),
     "narrates a file's path: 'written to /tmp/out/results.csv' (line 1)"),
    ("no_path_narration", {}, doc("I wrote a poem."), "no path narration",
     doc("Output saved as `summary.md`."), "narrates a file's path: 'saved as `summary.md' (line 1)"),
    ("has_sections", {"required": ["Topic", "Motivation"], "any_of": ["Evidence", "Broad impact"]},
     doc("**Topic:** agents\n**motivation**: cost\n## Evidence and impact\nlots"),
     "all 2 required labels present, and 'Evidence'",
     doc("**Topic** x\n**Evidenced** y"),
     "missing 'Motivation'; none of 'Evidence', 'Broad impact' (labels seen: 'topic', 'evidenced')"),
    ("has_sections", {"required": ["Topic"]}, doc("## 1. Topic\n"), "all 1 required labels present",
     doc("Topic: no label"), "missing 'Topic' (labels seen: none)"),
    ("names_required", {"names": ["/annotate", "/introspect", "/search"]},
     doc("Skills: /annotate and /search."),
     "2 of 3 names mentioned (need >= 2): '/annotate', '/search'; missing '/introspect'",
     doc("Skills: /annotated and /searching."),
     "0 of 3 names mentioned (need >= 2); missing '/annotate', '/introspect', '/search'"),
    ("names_required", {"names": ["Alpha", "Beta"], "at_least": 1.0, "ignore_case": True},
     doc("alpha, BETA"), "2 of 2 names mentioned (need >= 2): 'Alpha', 'Beta'",
     doc("Alpha only"), "1 of 2 names mentioned (need >= 2): 'Alpha'; missing 'Beta'"),
    ("no_hallucinated_names", {"known": ["/annotate", "/introspect"]},
     doc("Use /annotate, then /introspect.\nFiles live in /usr/lib and https://x.org/path; see ./a/b.md.\n"
         "```\n/summarize\n```"),
     "2 names seen, all known: '/annotate', '/introspect'",
     doc("Use /annotate.\nThen /summarize and /validate, /summarize again."),
     "names not in the known list: '/summarize' (line 2), '/validate' (line 2); 3 names seen"),
    ("no_hallucinated_names", {"known": ["lookup"], "pattern": r"`(\w+)\(\)`"}, doc("Call `lookup()`."),
     "1 names seen, all known: 'lookup'",
     doc("Call `fly()`."), "names not in the known list: 'fly' (line 1); 1 names seen"),
    ("has_h1", {}, doc("Intro\n  # Title #\n## Part"), "H1 heading 'Title'",
     doc("```\n# comment\n```\n#hashtag\n## Part"), "no H1 heading ('# Title' outside code blocks); "
                                                    "first line '```'"),
    ("has_h1", {}, doc("```inline``` code, not a fence\n# Title"), "H1 heading 'Title'",
     doc("````md\n```\n# Inside\n~~~\n````\ntext"), "no H1 heading ('# Title' outside code blocks); "
                                                     "first line '````md'"),  # only a ```` line closes ````
    ("has_h1", {}, doc("# T"), "H1 heading 'T'", doc(" "), "no H1 heading ('# Title' outside code blocks); "
                                                           "the text is empty"),
    # --- agents
    ("task_verdict", {}, attempt(passed=True), "verifier passed (completed)",
     AttemptOutput("r", 0, "t", 0), "verifier failed (unfinished)"),
    ("finished", {}, attempt(status="budget_exhausted"), "ended budget_exhausted (need completed or budget_exhausted)",
     attempt(status="infra_failure", reason="model call failed: 503"),
     "ended infra_failure: 'model call failed: 503' (need completed or budget_exhausted)"),
    ("finished", {}, attempt(), "ended completed (need completed or budget_exhausted)",
     AttemptOutput("r", 0, "t", 0), "no attempt.finished on the log (still running, or cut off)"),
    ("score_at_least", {"score": 0.5}, attempt(score=0.5), "score 0.5 (need >= 0.5)",
     attempt(score=0.25), "score 0.25 (need >= 0.5)"),
    ("steps_at_most", {"steps": 10}, attempt(steps=10), "10 steps (need <= 10)",
     attempt(steps=12), "12 steps (need <= 10)"),
    ("no_invalid_actions", {}, attempt(actions=7), "0 invalid actions + 0 tool errors = 0 of 7 actions (need <= 0)",
     attempt(actions=7, tool_errors=1), "0 invalid actions + 1 tool errors = 1 of 7 actions (need <= 0)"),
    ("no_invalid_actions", {"at_most": 2}, attempt(actions=9, invalid_actions=1, tool_errors=1),
     "1 invalid actions + 1 tool errors = 2 of 9 actions (need <= 2)",
     attempt(actions=9, invalid_actions=3), "3 invalid actions + 0 tool errors = 3 of 9 actions (need <= 2)"),
    ("no_loop", {}, attempt(longest_repeat=2), "longest run of one identical tool call: 2 (need < 3)",
     attempt(longest_repeat=3), "longest run of one identical tool call: 3 (need < 3)"),
    ("tool_used", {"name": "search", "at_least": 2}, attempt(tool_calls={"search": 2}),
     "'search' called 2 times (need >= 2)", attempt(tool_calls={"search": 1, "act": 4}),
     "'search' called once (need >= 2)"),
    ("tool_used", {"name": "search"}, attempt(tool_calls={"search": 1}), "'search' called once (need >= 1)",
     attempt(tool_calls={"act": 1}), "'search' called 0 times (need >= 1)"),
    ("tool_not_used", {"name": "shell"}, attempt(tool_calls={"act": 3}), "'shell' called 0 times (need 0)",
     attempt(tool_calls={"shell": 2}), "'shell' called 2 times (need 0)"),
    ("tools_known", {"known": ["act", "look"]}, attempt(tool_calls={"act": 3}), "1 tools called, all known: 'act'",
     attempt(tool_calls={"act": 3, "fly": 1, "dig": 2}),
     "called tools not in the known list: 'dig' (2 times), 'fly' (once)"),
    ("answer_matches", {"pattern": r"\bparis\b", "flags": "i"}, attempt(answer="The capital is Paris."),
     r"/\bparis\b/i matched 'Paris' at character 15", attempt(answer="The capital is Lyon.\nOr maybe not."),
     r"no match of /\bparis\b/i in the answer 'The capital is Lyon. Or maybe not.'"),
    ("answer_matches", {"pattern": "^42$", "flags": "m"}, attempt(answer="thinking", submitted="x\n42"),
     "/^42$/m matched '42' at character 2", attempt(), "no answer to match /^42$/m against"),
]


@pytest.mark.parametrize(("name", "params", "good", "good_detail", "bad", "bad_detail"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_criterion_passes_and_fails_with_a_detail_of_what_it_saw(
        name: str, params: dict[str, Any], good: AttemptOutput, good_detail: str, bad: AttemptOutput,
        bad_detail: str) -> None:
    assert verdict(name, params, good) == (True, good_detail)
    assert verdict(name, params, bad) == (False, bad_detail)


def test_every_registered_criterion_has_cases() -> None:
    assert {c[0] for c in CASES} == set(CRITERIA)


def test_document_criteria_are_marked_and_read_the_submitted_answer_first() -> None:
    documents = {name for name, kind in CRITERIA.items() if kind.document}
    assert documents == {"min_bytes", "min_lines", "exact_sections", "min_sections", "no_placeholders",
                         "has_examples", "no_path_narration", "has_sections", "names_required",
                         "no_hallucinated_names", "has_h1"}
    out = doc("thinking out loud, no heading", submitted="# Final\n\n## Only")
    assert verdict("has_h1", {}, out) == (True, "H1 heading 'Final'")
    assert verdict("exact_sections", {"n": 1}, out)[0]
    assert all(kind.doc for kind in CRITERIA.values())


def test_a_huge_output_is_judged_fast_and_outlined_once() -> None:
    big = doc("# T\n" + "".join(f"## Part {i}\nFor example, {i}.\n" for i in range(2000)))
    checks = [build(n, p, where="w") for n, p in [("exact_sections", {"n": 2000}), ("has_h1", {}),
                                                  ("has_examples", {}), ("no_path_narration", {})]]
    outline.cache_clear()
    assert all(judge(c, big)[0] for c in checks)
    assert outline.cache_info().misses == 1


# --- judging and bad parameters -----------------------------------------------------------------------


def test_a_raising_check_is_a_failed_criterion_with_the_error_as_detail() -> None:
    def broken(out: AttemptOutput) -> tuple[bool, str]:
        return out.steps / 0 > 1, "never"
    assert judge(broken, attempt()) == (False, "criterion raised ZeroDivisionError: division by zero")

    def wordy(out: AttemptOutput) -> tuple[bool, str]:
        raise ValueError("x" * 10_000)
    passed, detail = judge(wordy, attempt())
    assert not passed and detail == "criterion raised ValueError: " + "x" * 497 + "..."

    def shapeless(out: AttemptOutput) -> tuple[bool, str]:
        return True  # type: ignore[return-value]  # a check that forgot its detail
    assert judge(shapeless, attempt()) == (False, "criterion raised TypeError: cannot unpack non-iterable bool "
                                                  "object")


def test_a_builder_raising_at_judge_time_is_caught_for_a_registered_kind_too() -> None:
    name = "test_only_broken"

    @criterion(name, NoParams)
    def broken(_: NoParams) -> Any:
        """Reads a field that is not there."""
        return lambda out: (out.no_such_field, "never")
    try:
        assert judge(build(name, {}, where="w"), attempt()) == (
            False, "criterion raised AttributeError: 'AttemptOutput' object has no attribute 'no_such_field'")
        with pytest.raises(EvalError, match="criterion 'test_only_broken' is registered twice"):
            criterion(name, NoParams)(broken)
    finally:
        del CRITERIA[name]


@pytest.mark.parametrize(("name", "params", "message"), [
    ("nope", {}, "suite task 'coin': unknown criterion 'nope'; known: answer_matches, "),
    ("steps_at_most", {"steps": "ten"}, "suite task 'coin': criterion 'steps_at_most': Expected `int`, got `str` - "
                                        "at `$.steps`"),
    ("steps_at_most", {}, "suite task 'coin': criterion 'steps_at_most': Object missing required field `steps`"),
    ("steps_at_most", {"steps": -1}, "criterion 'steps_at_most': Expected `int` >= 0 - at `$.steps`"),
    ("min_bytes", {"n": 3, "bytes": 4}, "suite task 'coin': criterion 'min_bytes': Object contains unknown field "
                                        "`bytes`"),
    ("min_bytes", [3], "suite task 'coin': criterion 'min_bytes': params must be a mapping of names to values, "
                       "not list"),
    ("answer_matches", {"pattern": "(unclosed"}, "suite task 'coin': criterion 'answer_matches': pattern "
                                                 "'(unclosed' is not a regular expression: missing ), "),
    ("answer_matches", {"pattern": "a", "flags": "iq"}, "suite task 'coin': criterion 'answer_matches': flags 'iq': "
                                                        "unknown flag 'q' (known: imsx)"),
    ("no_hallucinated_names", {"known": [], "pattern": "[a-"}, "suite task 'coin': criterion "
                                                               "'no_hallucinated_names': pattern '[a-' is not a "),
    ("has_sections", {"required": [], "any_of": []}, "suite task 'coin': criterion 'has_sections': has_sections "
                                                     "needs at least one label"),
    ("has_sections", {"required": [""]}, "suite task 'coin': criterion 'has_sections': Expected `str` of length "
                                         ">= 1 - at `$.required[0]`"),
    ("names_required", {"names": ["a"], "at_least": 1.5}, "criterion 'names_required': Expected `float` <= 1.0"),
    ("names_required", {"names": []}, "criterion 'names_required': Expected `array` of length >= 1"),
    ("no_loop", {"repeats": 1}, "criterion 'no_loop': Expected `int` >= 2"),
    ("tool_used", {"name": "search", "at_least": 0}, "criterion 'tool_used': Expected `int` >= 1"),
    ("tool_not_used", {"name": ""}, "criterion 'tool_not_used': Expected `str` of length >= 1"),
    ("task_verdict", {"strict": True}, "criterion 'task_verdict': Object contains unknown field `strict`"),
])
def test_bad_parameters_are_an_eval_error_naming_where_and_the_criterion(name: str, params: Any,
                                                                        message: str) -> None:
    with pytest.raises(EvalError) as caught:
        build(name, params, where="suite task 'coin'")
    assert str(caught.value).startswith(f"suite task 'coin': {'unknown ' if name == 'nope' else ''}criterion {name!r}")
    assert message in str(caught.value)
    assert isinstance(caught.value, UnknownCriterion) == (name == "nope")


# --- the reference page -------------------------------------------------------------------------------


def reference_entries() -> dict[str, list[dict[str, Any]]]:
    """Each criterion's section of docs/criteria.md and the suite entries of its example."""
    sections = re.split(r"^### `(\w+)`", DOCS.read_text(), flags=re.M)[1:]
    found: dict[str, list[dict[str, Any]]] = {}
    for name, body in zip(sections[::2], sections[1::2], strict=True):
        blocks = re.findall(r"```yaml\n(.*?)```", body, re.S)
        found[name] = [entry for block in blocks for entry in yaml.safe_load(block)["criteria"]]
    return found


def test_the_reference_documents_every_criterion_with_an_example_that_builds() -> None:
    entries = reference_entries()
    assert sorted(entries) == sorted(CRITERIA)
    text = DOCS.read_text()
    for name, kind in CRITERIA.items():
        assert entries[name], f"{name}: no example"
        for entry in entries[name]:
            assert entry["name"] == name
            build(name, entry.get("params", {}), where=f"docs/criteria.md {name}")
        for field in kind.params.__struct_fields__:
            assert f"`{field}`" in text.split(f"### `{name}`")[1].split("\n### ")[0], f"{name}: {field} undocumented"
