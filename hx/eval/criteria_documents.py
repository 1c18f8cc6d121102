"""The document criteria: size, structure and content checks of an attempt's output text as a Markdown document.

They read ``AttemptOutput.text`` (what the attempt submitted through a tool, else the main model's
last content). Markdown is read the CommonMark way where it matters: ATX headings (``## Title``,
up to three spaces in), fenced code blocks (```` ``` ```` or ``~~~``) whose content is code, not
headings or prose. Each text is outlined once (``outline``, cached), so the several criteria of one
task do not parse it again. Registered on import of ``hx.eval.criteria``; docs/criteria.md is the
reference.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Annotated, NamedTuple

import msgspec

from hx.eval.criteria import Check, NoParams, compile_pattern, criterion, listed, shown
from hx.eval.errors import EvalError
from projections.attempt_outputs import AttemptOutput

Name = Annotated[str, msgspec.Meta(min_length=1)]

STRUCTURAL = frozenset({
    "introduction", "intro", "overview", "summary", "executive summary", "abstract", "background", "conclusion",
    "conclusions", "concluding remarks", "final thoughts", "references", "bibliography", "sources",
    "further reading", "contents", "table of contents", "tl;dr", "tldr"})
"""Headings that frame a document rather than hold its content: ``exact_sections`` and ``min_sections`` skip them."""

PLACEHOLDER_WORDS = ("TODO", "TBD", "FIXME")
"""Placeholder words, matched as whole words in capitals (a "todo list" is not one)."""
PLACEHOLDER_PHRASES = ("[placeholder]", "placeholder text", "lorem ipsum", "add example here", "example goes here",
                       "insert example here", "implementation note here", "brief implementation note",
                       "your text here", "content goes here")
"""Placeholder phrases, matched in any case."""
EXAMPLE_PHRASES = ("for example", "for instance", "e.g.", "example:", "examples:", "implementation note")
"""Phrases that introduce an example, matched in any case (besides a code block, or a heading or bold label
starting with "example")."""
FILE_TYPES = ("md", "markdown", "txt", "rst", "json", "jsonl", "csv", "tsv", "html", "htm", "pdf", "doc", "docx",
              "xls", "xlsx", "yaml", "yml", "toml", "log", "ipynb", "py", "png", "jpg", "jpeg", "svg", "zip", "gz")
"""File extensions that make a bare file name a path for ``no_path_narration``."""
KNOWN_NAME_PATTERN = r"(?<![\w/.~:-])/[a-z_][a-z0-9_-]*(?![\w/-]|\.\w)"
"""``no_hallucinated_names``'s default: a slash command standing alone, not a piece of a path or URL."""

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$", re.M)
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*))?$", re.M)
_BOLD = re.compile(r"\*\*(?=\S)(.{1,200}?)\*\*|__(?=\S)(.{1,200}?)__")  # bounded: no quadratic scan of a long line
_NUMBERING = re.compile(r"^(?:(?:section|part|chapter|step)\s+)?(?:\d+(?:\.\d+)*(?:[.):]|\s)|[ivx]+[.)]|[a-z][.)])"
                        r"\s*[-:–—]?\s*", re.IGNORECASE)
_MARKUP = re.compile(r"[*_`]+")
_TRAILING = re.compile(r"[\s:.\-–—]+$")
_PLACEHOLDER_WORD = re.compile(r"\b(?:" + "|".join(PLACEHOLDER_WORDS) + r")\b")
_PLACEHOLDER_BRACKET = re.compile(r"[\[<{](?:insert|add|your|placeholder)\b[^\]>}\n]{0,60}[\]>}]", re.IGNORECASE)
_EXAMPLE_LABEL = re.compile(r"examples?\b")
_EXAMPLE = re.compile("|".join(re.escape(p) for p in EXAMPLE_PHRASES), re.IGNORECASE)
_PATH = (r"(?:~[/\\]|\.{1,2}[/\\]|/(?![/\s])|[a-z]:[/\\])[^\s`'\")\]]*"
         r"|[a-z_][\w-]*(?:[/\\][\w.-]+)+"
         r"|[\w-]+\.(?:" + "|".join(FILE_TYPES) + r")\b")
_NARRATION = re.compile(
    r"\b(?:sav(?:e|es|ed|ing)|writ(?:e|es|ten|ing)|wrote|stor(?:e|es|ed|ing)|export(?:s|ed|ing)?|dump(?:s|ed)?"
    r"|creat(?:e|es|ed|ing)|put)\b(?:[ \t]+\S+){0,6}?[ \t]+(?:to|in|at|as|into|under|on)[ \t]+[`'\"(]?(?:"
    + _PATH + r")", re.IGNORECASE)

_FILE_NAME = re.compile(r"\.(?:" + "|".join(FILE_TYPES) + r")\b", re.IGNORECASE)


class Outline(NamedTuple):
    """A text read as Markdown: its prose (code blocks blanked), headings by level, and labels."""

    prose: str
    """The text with the content of fenced code blocks replaced by empty lines (line numbers kept)."""
    code_blocks: int
    headings: tuple[tuple[int, str], ...]
    """(level, title) of each ATX heading outside code blocks, in order."""
    labels: tuple[str, ...]
    """Every heading title and bold span, normalised (``label``)."""


def label(title: str) -> str:
    """A heading or bold title normalised for comparison: markup, numbering and trailing punctuation dropped.

    >>> [label(t) for t in ("1. **Introduction:**", "IV) Broad  Impact", "Step 2 - Setup", "3D printing")]
    ['introduction', 'broad impact', 'setup', '3d printing']
    """
    plain = _MARKUP.sub("", title).strip()
    plain = _NUMBERING.sub("", plain, count=1)
    return " ".join(_TRAILING.sub("", plain).lower().split())


def _heading_title(text: str) -> str:
    """A heading's title without its optional closing ``#`` run (``## Title ##``)."""
    title = text.strip()
    bare = title.rstrip("#")
    if bare != title and (not bare or bare[-1] in " \t"):
        title = bare.strip()
    return title


def _code_blocks(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each fenced code block, fence lines included; an unclosed one runs to the end."""
    blocks: list[tuple[int, int]] = []
    opened, fence = -1, ""
    for m in _FENCE.finditer(text):
        run, rest = m.group(1), m.group(2)
        if opened < 0:
            if run[0] == "`" and "`" in rest:
                continue  # a backtick fence's info string has no backtick: this is inline code
            opened, fence = m.start(), run
        elif run[0] == fence[0] and len(run) >= len(fence) and not rest.strip():
            blocks.append((opened, m.end()))
            opened = -1
    if opened >= 0:
        blocks.append((opened, len(text)))
    return blocks


@lru_cache(maxsize=256)
def outline(text: str) -> Outline:
    """The Markdown outline of ``text`` (cached: a task's criteria read the same text)."""
    blocks = _code_blocks(text) if "```" in text or "~~~" in text else []
    pieces: list[str] = []
    at = 0
    for start, end in blocks:  # blank the code, keep its newlines so line numbers hold
        pieces += [text[at:start], "\n" * text.count("\n", start, end)]
        at = end
    body = "".join([*pieces, text[at:]]) if blocks else text
    headings: list[tuple[int, str]] = []
    for m in _HEADING.finditer(body):
        title = _heading_title(m.group(2) or "")
        if title:
            headings.append((len(m.group(1)), title))
    bold = [a or b for a, b in _BOLD.findall(body)] if "**" in body or "__" in body else []
    return Outline(body, len(blocks), tuple(headings), tuple(label(t) for t in [*(t for _, t in headings), *bold]))


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _content_sections(out: AttemptOutput) -> tuple[list[str], list[str]]:
    """The H2 titles of the output text: (content sections, structural ones)."""
    content: list[str] = []
    structural: list[str] = []
    for level, title in outline(out.text).headings:
        if level == 2:
            (structural if label(title) in STRUCTURAL else content).append(title)
    return content, structural


def _sections_detail(content: list[str], structural: list[str], need: str) -> str:
    seen = f"{len(content)} content sections ({need})"
    seen += f": {listed(content)}" if content else ""
    return seen + (f"; structural, not counted: {listed(structural)}" if structural else "")


class Size(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A size in bytes, lines or sections."""

    n: Annotated[int, msgspec.Meta(ge=0)]


@criterion("min_bytes", Size, document=True)
def min_bytes(p: Size) -> Check:
    """The output text is at least ``n`` bytes of UTF-8."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        size = len(out.text.encode())
        return size >= p.n, f"{size} bytes (need >= {p.n})"
    return check


@criterion("min_lines", Size, document=True)
def min_lines(p: Size) -> Check:
    """The output text has at least ``n`` non-blank lines."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        lines = sum(1 for line in out.text.splitlines() if line.strip())
        return lines >= p.n, f"{lines} non-blank lines (need >= {p.n})"
    return check


@criterion("exact_sections", Size, document=True)
def exact_sections(p: Size) -> Check:
    """Exactly ``n`` H2 content sections; structural ones (introduction, summary, ...) do not count."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        content, structural = _content_sections(out)
        return len(content) == p.n, _sections_detail(content, structural, f"need exactly {p.n}")
    return check


@criterion("min_sections", Size, document=True)
def min_sections(p: Size) -> Check:
    """At least ``n`` H2 content sections; structural ones (introduction, summary, ...) do not count."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        content, structural = _content_sections(out)
        return len(content) >= p.n, _sections_detail(content, structural, f"need >= {p.n}")
    return check


class Placeholders(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """More placeholder phrases to refuse, besides the built-in ones."""

    extra: list[Name] = []


def _placeholders(text: str, phrases: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, end) of each placeholder in ``text``, leftmost first, none inside another."""
    found: list[tuple[int, int]] = []
    if any(word in text for word in PLACEHOLDER_WORDS):  # plain substring tests first: regexes are the slow part
        found += [m.span() for m in _PLACEHOLDER_WORD.finditer(text)]
    if any(c in text for c in "[<{"):
        found += [m.span() for m in _PLACEHOLDER_BRACKET.finditer(text)]
    lower = text.lower()
    for phrase in phrases:
        at = lower.find(phrase)
        while at >= 0:
            found.append((at, at + len(phrase)))
            at = lower.find(phrase, at + len(phrase))
    kept: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if not kept or start >= kept[-1][1]:
            kept.append((start, end))
    return kept


@criterion("no_placeholders", Placeholders, document=True)
def no_placeholders(p: Placeholders) -> Check:
    """No placeholder text: TODO, TBD, FIXME, "[placeholder]", "[insert ...]", "add example here", ``extra``."""
    phrases = PLACEHOLDER_PHRASES + tuple(x.lower() for x in p.extra)

    def check(out: AttemptOutput) -> tuple[bool, str]:
        text = out.text
        found = [f"{shown(text[a:b], 40)} (line {_line_of(text, a)})" for a, b in _placeholders(text, phrases)]
        if found:
            more = f" and {len(found) - 5} more" if len(found) > 5 else ""
            return False, f"placeholder text found: {', '.join(found[:5])}{more}"
        return True, "no placeholder text"
    return check


@criterion("has_examples", NoParams, document=True)
def has_examples(_: NoParams) -> Check:
    """The text gives an example: a code block, an "Example" heading or bold label, "for example", "e.g.", ..."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        doc = outline(out.text)
        if doc.code_blocks:
            return True, f"{doc.code_blocks} code block{'s' if doc.code_blocks > 1 else ''}"
        titled = [t for t in doc.labels if _EXAMPLE_LABEL.match(t)]
        if titled:
            return True, f"example label {shown(titled[0], 40)}"
        phrase = _EXAMPLE.search(doc.prose)
        if phrase:
            return True, f"example phrase {shown(phrase.group(0))} (line {_line_of(doc.prose, phrase.start())})"
        return False, "no example: no code block, no example label, none of " + ", ".join(
            repr(p) for p in EXAMPLE_PHRASES)
    return check


@criterion("no_path_narration", NoParams, document=True)
def no_path_narration(_: NoParams) -> Check:
    """The prose does not narrate where a file went ("saved to ~/notes.md", "written to /tmp/out.txt")."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        prose = outline(out.text).prose
        pathless = not any(c in prose for c in "/\\~") and not _FILE_NAME.search(prose)
        found = None if pathless else _NARRATION.search(prose)  # most prose names no path: skip the slow regex
        if found:
            said = shown(found.group(0).rstrip(".,;:"))
            return False, f"narrates a file's path: {said} (line {_line_of(prose, found.start())})"
        return True, "no path narration"
    return check


class Labels(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Section labels: all of ``required``, and at least one of ``any_of`` when given."""

    required: list[Name]
    any_of: list[Name] = []


def _has_label(labels: tuple[str, ...], wanted: str) -> bool:
    n = len(wanted)
    return any(have == wanted or (have.startswith(wanted) and not have[n].isalnum()) for have in labels)


@criterion("has_sections", Labels, document=True)
def has_sections(p: Labels) -> Check:
    """Every ``required`` label, and one of ``any_of``, is a heading or a bold label (case ignored)."""
    if not p.required and not p.any_of:
        raise EvalError("has_sections needs at least one label in required or any_of")
    required = [(r, label(r)) for r in p.required]
    any_of = [(a, label(a)) for a in p.any_of]

    def check(out: AttemptOutput) -> tuple[bool, str]:
        labels = outline(out.text).labels
        missing = [shown_ for shown_, wanted in required if not _has_label(labels, wanted)]
        present = [shown_ for shown_, wanted in any_of if _has_label(labels, wanted)]
        problems = [f"missing {listed(missing)}"] if missing else []
        if any_of and not present:
            problems.append(f"none of {listed(a for a, _ in any_of)}")
        if problems:
            return False, "; ".join(problems) + f" (labels seen: {listed(labels) if labels else 'none'})"
        return True, f"all {len(required)} required labels present" + (f", and {listed(present)}" if any_of else "")
    return check


class RequiredNames(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Names the text should mention, and the share of them it must."""

    names: Annotated[list[Name], msgspec.Meta(min_length=1)]
    at_least: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    ignore_case: bool = False


@criterion("names_required", RequiredNames, document=True)
def names_required(p: RequiredNames) -> Check:
    """At least the share ``at_least`` of ``names`` (and at least one) is mentioned, each as a whole word."""
    flags = re.IGNORECASE if p.ignore_case else 0
    patterns = [(name, re.compile(rf"(?<!\w){re.escape(name)}(?!\w)", flags)) for name in p.names]
    need = max(1, math.ceil(p.at_least * len(p.names) - 1e-9))

    def check(out: AttemptOutput) -> tuple[bool, str]:
        text = out.text
        found = [name for name, regex in patterns if regex.search(text)]
        missing = [name for name, _ in patterns if name not in found]
        detail = f"{len(found)} of {len(patterns)} names mentioned (need >= {need})"
        detail += f": {listed(found)}" if found else ""
        return len(found) >= need, detail + (f"; missing {listed(missing)}" if missing else "")
    return check


class KnownNames(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The registry of real names, and the regular expression that finds name-like strings in the text."""

    known: list[str]
    pattern: Annotated[str, msgspec.Meta(min_length=1)] = KNOWN_NAME_PATTERN
    flags: str = ""


@criterion("no_hallucinated_names", KnownNames, document=True)
def no_hallucinated_names(p: KnownNames) -> Check:
    """Every name the prose mentions (``pattern``'s match, or its first group) is one of the ``known`` names."""
    regex = compile_pattern(p.pattern, p.flags)
    group = 1 if regex.groups else 0  # with a group, the group is the name (`(\w+)\(\)` finds "lookup")
    known = frozenset(p.known)

    def check(out: AttemptOutput) -> tuple[bool, str]:
        prose = outline(out.text).prose
        seen: dict[str, int] = {}
        for m in regex.finditer(prose):
            seen.setdefault(m.group(group), m.start())
        invented = [f"{shown(name, 40)} (line {_line_of(prose, at)})" for name, at in seen.items()
                    if name not in known]
        if invented:
            return False, f"names not in the known list: {', '.join(invented[:8])}" + (
                f" and {len(invented) - 8} more" if len(invented) > 8 else "") + f"; {len(seen)} names seen"
        return True, f"{len(seen)} names seen, all known" + (f": {listed(seen)}" if seen else "")
    return check


@criterion("has_h1", NoParams, document=True)
def has_h1(_: NoParams) -> Check:
    """The text has a top-level heading (``# Title``) outside code blocks."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        titles = [title for level, title in outline(out.text).headings if level == 1]
        if titles:
            return True, f"H1 heading {shown(titles[0])}"
        lines = [line for line in out.text.splitlines() if line.strip()]
        return False, "no H1 heading ('# Title' outside code blocks)" + (
            f"; first line {shown(lines[0])}" if lines else "; the text is empty")
    return check
