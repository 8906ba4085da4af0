"""Deterministic synthetic text of a given approximate token length.

Token estimate (used everywhere in the benchmark): about ``CHARS_PER_TOKEN`` = 4 characters per token, the
usual rule of thumb for English text with BPE tokenizers; a synthetic text of ``n`` tokens has exactly
``4 * n`` characters. Text is drawn from a fixed vocabulary with a seeded ``random.Random``, so the same
seed always gives the same text.
"""

from __future__ import annotations

import random

CHARS_PER_TOKEN = 4

_WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an had they you were their one all we can her has there been if more when will would who so
no time data model system cache token request server memory engine batch prefix route worker
query answer result value table index block queue graph node layer vector matrix policy load
balance latency throughput network packet stream signal sample report budget market price order
customer product service account payment invoice contract policy review summary chapter section
figure example method function variable library module package version release feature support
issue change update test build deploy cluster region storage volume backup restore monitor alert
metric dashboard trace event river mountain forest ocean island valley desert garden city
village bridge road station harbor castle museum theater library school teacher student lesson
history science music painting story morning evening winter summer spring autumn weather cloud
rain snow wind light shadow color sound
"""
_VOCABULARY = tuple(_WORDS.split())


def estimate_tokens(text: str) -> int:
    """Approximate token count of ``text`` (characters / 4, rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def rng_for(*parts: object) -> random.Random:
    """A ``random.Random`` seeded deterministically (across processes) from ``parts``."""
    return random.Random(":".join(str(p) for p in parts))


def random_text(rng: random.Random, tokens: int) -> str:
    """Words from the vocabulary, cut to exactly ``tokens * 4`` characters."""
    n_chars = max(0, tokens) * CHARS_PER_TOKEN
    if n_chars == 0:
        return ""
    text = " ".join(rng.choices(_VOCABULARY, k=n_chars // 6 + 4))
    while len(text) < n_chars:
        text += " " + " ".join(rng.choices(_VOCABULARY, k=n_chars // 6 + 4))
    return text[:n_chars]


def tagged_text(tag: str, rng: random.Random, tokens: int) -> str:
    """``tag`` then random words, ``tokens * 4`` characters in all (the tag makes the text unique)."""
    head = f"[{tag}] "
    body = random_text(rng, tokens)
    return (head + body)[: max(len(head), len(body))]
