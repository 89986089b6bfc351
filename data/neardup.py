"""Near-duplicates of eval prompts: what the train/eval guard drops from training.

Texts are compared as lowercase word sequences (`\\w+` runs: punctuation, case and
whitespace drop out). A training text T is a near-duplicate of an eval text E when
at least CONTAINMENT of E's word SHINGLE-grams also occur in T: T repeats most of
E, alone or inside a longer request ("Answer this: <E>"), or differs from it in a
number or a word ("... after 8 years?" vs "... after 9 years?"). A text shorter
than SHINGLE words is one gram, so it matches only a text with the same words.
The test is one-sided on purpose: a short generic T ("What do you think about
politics") that shares one phrase with a long E is not a copy of E.

Measured (README "Prompt data"): none of ShareGPT's 57,267 distinct user-turn prompts
near-duplicates one of MT-bench's 160 turns, while 30 of the 475 draftsmith and HumanEval
prompts near-duplicate another of them (one question with other numbers).
"""

from __future__ import annotations

import re
from collections import Counter

SHINGLE = 5
CONTAINMENT = 0.5
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(text: str) -> set[tuple[str, ...]]:
    w = words(text)
    if len(w) < SHINGLE:
        return {tuple(w)}
    return set(zip(*(w[i:] for i in range(SHINGLE))))


class EvalIndex:
    """The eval texts' shingles, indexed so each training text costs one set intersection."""

    def __init__(self, texts: list[str]):
        self.sizes = []
        self.owners: dict[tuple[str, ...], list[int]] = {}
        for i, text in enumerate(texts):
            grams = shingles(text)
            self.sizes.append(len(grams))
            for g in grams:
                self.owners.setdefault(g, []).append(i)

    def is_near_duplicate(self, text: str) -> bool:
        shared = Counter()
        for g in shingles(text) & self.owners.keys():
            shared.update(self.owners[g])
        return any(n >= CONTAINMENT * self.sizes[i] for i, n in shared.items())
