"""GAIA's normalised exact match: the scoring rule of the GAIA benchmark, written from its description.

The reference answer decides how the two are compared:

- a number (anything ``float`` parses): the model's answer, stripped of ``$``, ``%`` and ``,``,
  must parse to the same float;
- a list (the reference contains ``,`` or ``;``): both are split on either separator, must have
  the same length, and are compared element by element, numbers as numbers and the rest as
  strings with whitespace removed and case folded (punctuation kept);
- otherwise a string: whitespace and punctuation removed, case folded, then equal.

>>> gaia_match("$1,234", "1234")
True
>>> gaia_match("Paris, France", "paris,france")
True
"""

from __future__ import annotations

import math
import re
import string

_SEPARATORS = re.compile(r"[,;]")
_SPACE = re.compile(r"\s")
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
_NOT_A_NUMBER = math.inf
"""What an answer that does not parse becomes: equal to no finite reference."""


def is_number(text: str) -> bool:
    """True when ``float`` parses the text as it is."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def as_number(text: str) -> float:
    """The text as a float after dropping ``$``, ``%`` and ``,``; ``inf`` when it is no number."""
    for char in "$%,":
        text = text.replace(char, "")
    try:
        return float(text)
    except ValueError:
        return _NOT_A_NUMBER


def normalise(text: str, *, punctuation: bool = True) -> str:
    """Whitespace removed and case folded; punctuation removed too unless ``punctuation`` is False."""
    squeezed = _SPACE.sub("", text).lower()
    return squeezed.translate(_NO_PUNCTUATION) if punctuation else squeezed


def _same_number(answer: str, reference: str) -> bool:
    return as_number(answer) == float(reference)


def gaia_match(answer: str | None, reference: str) -> bool:
    """True when ``answer`` matches the ``reference`` answer under GAIA's normalised exact match."""
    answer = "None" if answer is None else answer
    if is_number(reference):
        return _same_number(answer, reference)
    if _SEPARATORS.search(reference):
        expected = _SEPARATORS.split(reference)
        given = _SEPARATORS.split(answer)
        if len(expected) != len(given):
            return False
        return all(_same_number(g, e) if is_number(e) else
                   normalise(g, punctuation=False) == normalise(e, punctuation=False)
                   for g, e in zip(given, expected, strict=True))
    return normalise(answer) == normalise(reference)
