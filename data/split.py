"""A deterministic, category-stratified train/eval split by hash of (seed, prompt text).

Each prompt's rank is sha256(seed, key); within every category the lowest ranks
go to eval. Nothing depends on file order or Python's hash seed, so the same
prompts and seed give the same split on every machine, and adding prompts to
one category never moves prompts of another. Caps (`max_eval_prompts`,
`max_train_prompts`) keep the lowest-ranked prompts of each category in
proportion to the category sizes (largest remainder), so balance survives.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict


def rank(key: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{key}".encode()).digest()[:8], "big")


def by_category(items: list, seed: int) -> dict[str, list]:
    """{category: items sorted by rank}, categories in sorted order."""
    groups = defaultdict(list)
    for it in items:
        groups[it.category].append(it)
    return {c: sorted(groups[c], key=lambda it: rank(it.key, seed)) for c in sorted(groups)}


def allocate(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Split `total` over categories in proportion to `sizes` (largest remainder, ties by name)."""
    n = sum(sizes.values())
    if total >= n:
        return dict(sizes)
    exact = {c: total * s / n for c, s in sizes.items()}
    alloc = {c: int(x) for c, x in exact.items()}
    left = total - sum(alloc.values())
    for c in sorted(sizes, key=lambda c: (-(exact[c] - alloc[c]), c))[:left]:
        alloc[c] += 1
    return alloc


def balanced_take(items: list, n: int, seed: int) -> list:
    """The `n` lowest-ranked items, spread over categories in proportion; ordered by rank."""
    groups = by_category(items, seed)
    alloc = allocate({c: len(g) for c, g in groups.items()}, n)
    taken = [it for c, g in groups.items() for it in g[: alloc[c]]]
    return sorted(taken, key=lambda it: rank(it.key, seed))


def eval_count(n: int, fraction: float) -> int:
    """Eval prompts for a category of n: round(n * fraction), at least 1 once there are 2."""
    if n < 2:
        return 0
    return min(n - 1, max(1, round(n * fraction)))


def split_prompts(
    items: list,
    eval_fraction: float,
    seed: int,
    max_eval: int | None = None,
    max_train: int | None = None,
    *,
    train_only: list = (),
    eval_only: list = (),
) -> tuple[list, list]:
    """(train, eval), disjoint by key, each ordered by rank (categories interleaved).

    `items` (sources of role both) are split per category by rank; `train_only` all
    go to train and `eval_only` all to eval. Eval prompts beyond `max_eval` go back
    to train: they are never measured, so training on them leaks nothing, and the
    text is not wasted. Eval-only prompts beyond it are dropped instead: their
    source said they are never trained on.
    """
    train, evals = list(train_only), list(eval_only)
    for group in by_category(items, seed).values():
        k = eval_count(len(group), eval_fraction)
        evals += group[:k]
        train += group[k:]
    if max_eval is not None and len(evals) > max_eval:
        kept = balanced_take(evals, max_eval, seed)
        stay_out = {it.key for it in kept} | {it.key for it in eval_only}
        train += [it for it in evals if it.key not in stay_out]
        evals = kept
    if max_train is not None and len(train) > max_train:
        train = balanced_take(train, max_train, seed)
    order = lambda it: rank(it.key, seed)  # noqa: E731
    return sorted(train, key=order), sorted(evals, key=order)
