"""The ``lm`` policy's tokenizer: a byte-level BPE trained locally, stored as ``tokenizer.json`` bytes.

Byte-level BPE covers every byte, so any text encodes and decodes back exactly; the merges
only decide how compactly. The default corpus is generic on purpose (a frozen copy of the
project's docs plus the printable ASCII alphabet), so no game or task knowledge leaks into the vocabulary,
and nothing is downloaded at run time.

>>> tok = train_tokenizer(["the quick brown fox jumps over the lazy dog"], vocab=300)
>>> ids = tok.encode("a fox <eos>").ids
>>> ids[-1] == tok.token_to_id(EOS), tok.decode(ids, skip_special_tokens=False)
(True, 'a fox <eos>')
>>> load_tokenizer(tokenizer_bytes(tok)).encode("a fox").ids == tok.encode("a fox").ids
True
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hx.learner.errors import PolicyError

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
ROLES = {"system": "<system>", "user": "<user>", "assistant": "<assistant>", "tool": "<tool>"}
"""The marker token that opens a message of each role."""
TOOLS = "<tools>"
"""Opens the list of the tools offered."""
DECIDE = "<decide>"
"""Opens the header of one constrained decision (which tool, or which tool's property)."""
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS, *ROLES.values(), TOOLS, DECIDE)
"""In this order they take ids 0, 1, 2, ...: ``<pad>`` is 0 and ``<eos>`` is 1 in every trained tokenizer."""

DEFAULT_VOCAB = 1024
_CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"


def default_corpus() -> list[str]:
    """Generic training text: a frozen copy of the project's docs (shipped as package data) and the alphabet.

    Frozen, so the default tokenizer, and with it a fresh ``policy:lm``'s version, does not
    change when the docs do.
    """
    texts = [_CORPUS.read_text(encoding="utf-8")]
    # The alphabet line guarantees single-character tokens for ASCII.
    texts.append(string.printable)
    return texts


def train_tokenizer(texts: Iterable[str], vocab: int = DEFAULT_VOCAB) -> Tokenizer:
    """A byte-level BPE of at most ``vocab`` tokens (fewer if the text runs out of merges), with the special tokens."""
    if vocab < 256 + len(SPECIAL_TOKENS):
        raise PolicyError(f"tokenizer vocab {vocab} is too small: the 256 bytes and "
                          f"{len(SPECIAL_TOKENS)} special tokens need {256 + len(SPECIAL_TOKENS)}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def default_tokenizer(vocab: int = DEFAULT_VOCAB) -> Tokenizer:
    """The tokenizer trained on ``default_corpus()``; the same everywhere for a given vocabulary size."""
    return train_tokenizer(default_corpus(), vocab)


def tokenizer_bytes(tok: Tokenizer) -> bytes:
    """The tokenizer as ``tokenizer.json`` bytes."""
    return tok.to_str().encode("utf-8")


def load_tokenizer(data: bytes) -> Tokenizer:
    """A tokenizer from ``tokenizer.json`` bytes; ``PolicyError`` if unreadable or its special tokens are not ours."""
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # the library raises a bare Exception on a bad file
        raise PolicyError(f"tokenizer.json does not load: {e}") from e
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise PolicyError(f"tokenizer.json lacks the special tokens {SPECIAL_TOKENS} at ids 0..; found {ids}")
    return tok
