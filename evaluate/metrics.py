"""Speculative-decoding metrics: pure functions over per-prompt counts (engine.DecodeResult dicts).

Definitions (sums over prompts, so long prompts weigh by their tokens, not one vote each):
    acceptance rate          accepted draft tokens / proposed draft tokens
    alpha                    accepted draft tokens / draft tokens the target verified: the
                             per-token acceptance probability of Leviathan et al. 2023. A
                             round stops at its first rejection, so the drafts after it are
                             proposed but never judged; accepted / proposed is therefore
                             lower (alpha 0.36 reads as 0.14 at k = 4)
    mean accepted length     tokens emitted / target forwards (>= 1; 1 for target-only decoding)
    per-position acceptance  P(position i accepted | positions < i accepted), i = 1..k
    tokens/s                 tokens emitted / wall seconds
    speedup                  speculative tokens/s / target-only tokens/s on the same prompts
    draft cost ratio c       mean 1-token draft forward / mean 1-token target forward
    verify cost ratio v      mean (k+1)-token verify forward / mean 1-token target forward
    modelled speedup         (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), Leviathan et al. 2023,
                             eq. 1: expected tokens per round over the cost of a round in
                             target forwards, a verify forward costing as much as a 1-token one
    modelled speedup (v)     the same with the measured verify cost: (...) / (k c + v). On a GPU
                             v is close to 1; on a CPU a (k+1)-token forward costs more than a
                             1-token one, and this is the figure the measured speedup tracks
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def acceptance_rate(accepted: int, proposed: int) -> float | None:
    return _ratio(accepted, proposed)


def mean_accepted_length(tokens: int, target_forwards: int) -> float | None:
    return _ratio(tokens, target_forwards)


def per_position_acceptance(
    accepted_at: Sequence[int], reached_at: Sequence[int]
) -> list[float | None]:
    """accepted_at[i] / reached_at[i]: acceptance at position i given it was verified."""
    return [_ratio(a, r) for a, r in zip(accepted_at, reached_at)]


def tokens_per_second(tokens: int, seconds: float) -> float | None:
    return _ratio(tokens, seconds)


def speedup(spec_tokens_per_s: float | None, target_tokens_per_s: float | None) -> float | None:
    if spec_tokens_per_s is None or not target_tokens_per_s:
        return None
    return spec_tokens_per_s / target_tokens_per_s


def cost_ratio(time: float, n: int, base_time: float, base_n: int) -> float | None:
    """Mean forward time over the mean 1-token target forward time (draft c, or verify v)."""
    if not n or not base_n or not base_time:
        return None
    return (time / n) / (base_time / base_n)


def alpha(accepted_at: Sequence[int], reached_at: Sequence[int]) -> float | None:
    """Per-token acceptance probability: accepted drafts / drafts the target verified.

    Pooled over positions, this is the maximum-likelihood alpha of the i.i.d. model behind
    the modelled speedup (each verified draft accepted with probability alpha).
    """
    return _ratio(sum(accepted_at), sum(reached_at))


def expected_tokens_per_round(a: float, k: int) -> float:
    """E[tokens per target forward] when each draft token is accepted i.i.d. with prob a."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def modelled_speedup(
    a: float | None, k: int, c: float | None, verify_cost: float = 1.0
) -> float | None:
    """(1 - a^(k+1)) / ((1 - a)(k c + v)), a = alpha, v = verify cost in 1-token forwards."""
    if a is None or c is None or verify_cost is None:
        return None
    return expected_tokens_per_round(a, k) / (k * c + verify_cost)


def _sum(results: Iterable[dict], key: str) -> float:
    return sum(r[key] for r in results)


def _sum_lists(results: Sequence[dict], key: str) -> list[int]:
    width = max((len(r[key]) for r in results), default=0)
    out = [0] * width
    for r in results:
        for i, v in enumerate(r[key]):
            out[i] += v
    return out


def _tokens_per_s(results: Sequence[dict]) -> float | None:
    return tokens_per_second(sum(len(r["tokens"]) for r in results), _sum(results, "wall_time"))


def summarize(spec: Sequence[dict], target_only: Sequence[dict], k: int) -> dict:
    """One summary over matching per-prompt results (same prompts, same order)."""
    tokens = sum(len(r["tokens"]) for r in spec)
    proposed, accepted = int(_sum(spec, "proposed")), int(_sum(spec, "accepted"))
    forwards = int(_sum(spec, "target_forwards"))
    accepted_at, reached_at = _sum_lists(spec, "accepted_at"), _sum_lists(spec, "reached_at")
    a = alpha(accepted_at, reached_at)
    c = cost_ratio(
        _sum(spec, "draft_1tok_time"),
        int(_sum(spec, "draft_1tok_n")),
        _sum(target_only, "target_1tok_time"),
        int(_sum(target_only, "target_1tok_n")),
    )
    tps, base_tps = _tokens_per_s(spec), _tokens_per_s(target_only)
    verify_n = int(_sum(spec, "target_verify_n"))
    base_n = int(_sum(target_only, "target_1tok_n"))
    draft_n = int(_sum(spec, "draft_1tok_n"))
    v = cost_ratio(
        _sum(spec, "target_verify_time"),
        verify_n,
        _sum(target_only, "target_1tok_time"),
        base_n,
    )
    return {
        "num_prompts": len(spec),
        "tokens_generated": tokens,
        "tokens_proposed": proposed,
        "tokens_accepted": accepted,
        "acceptance_rate": acceptance_rate(accepted, proposed),
        "alpha": a,
        "mean_accepted_length": mean_accepted_length(tokens, forwards),
        "per_position_acceptance": per_position_acceptance(accepted_at, reached_at),
        "target_forwards": forwards,
        "tokens_per_s": tps,
        "target_tokens_per_s": base_tps,
        "speedup": speedup(tps, base_tps),
        "draft_cost_ratio": c,
        "verify_cost_ratio": v,
        "modelled_speedup": modelled_speedup(a, k, c),
        "modelled_speedup_verify": modelled_speedup(a, k, c, v) if v is not None else None,
        "draft_forward_ms": 1e3 * _ratio(_sum(spec, "draft_1tok_time"), draft_n)
        if draft_n
        else None,
        "target_forward_ms": (
            1e3 * _ratio(_sum(target_only, "target_1tok_time"), base_n) if base_n else None
        ),
        "target_verify_ms": (
            1e3 * _ratio(_sum(spec, "target_verify_time"), verify_n) if verify_n else None
        ),
    }


def per_category(
    spec: Sequence[dict], target_only: Sequence[dict], categories: Sequence[str], k: int
) -> dict[str, dict]:
    """summarize() for each category; the three sequences are aligned by prompt."""
    out = {}
    for cat in sorted(set(categories)):
        idx = [i for i, c in enumerate(categories) if c == cat]
        out[cat] = summarize([spec[i] for i in idx], [target_only[i] for i in idx], k)
    return out


def greedy_rounds(agree: Sequence[bool], k: int, budget: int | None = None) -> dict:
    """The rounds greedy speculative decoding takes, from teacher-forced agreement alone.

    agree[i]: the draft's argmax, fed the prompt and the target's own first i output tokens,
    equals the target's token i. Greedy rounds only ever extend the target's own output, so
    a round starting at token i accepts the agreeing run from i (at most k_round drafts)
    and then emits the target's token: one teacher-forced draft pass gives every count the
    engine reports (tests/test_specdec.py and tests/test_teacher_forced.py check this).

    budget: the max_new_tokens the output was decoded under (default: its length, i.e. it
    stopped at the budget). A round never drafts past the budget (k_round = min(k, budget -
    i - 1)); an output that ended with EOS before the budget still drafted full rounds, and
    when the draft agreed through that EOS the round emits only up to it.
    """
    n, i = len(agree), 0
    budget = n if budget is None else budget
    out = {"proposed": 0, "accepted": 0, "rounds": 0, "accepted_at": [0] * k, "reached_at": [0] * k}
    while i < n:
        k_round = min(k, budget - i - 1)
        acc = 0
        while acc < k_round and i + acc < n and agree[i + acc]:
            acc += 1
        if i + acc == n:  # agreed through the final (EOS) token: the round ends the output
            reached = emitted = n - i
        else:
            reached, emitted = min(acc + 1, k_round), acc
        for j in range(reached):
            out["reached_at"][j] += 1
        for j in range(emitted):
            out["accepted_at"][j] += 1
        out["proposed"] += k_round
        out["accepted"] += emitted
        out["rounds"] += 1
        i += acc + 1
    return out


def quartiles(xs: Sequence[float]) -> list[float]:
    """[q25, median, q75] (inclusive method: a single value gives three equal ones)."""
    if len(xs) == 1:
        return [xs[0]] * 3
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return [q1, q2, q3]


def per_prompt_speedups(spec: Sequence[dict], target_only: Sequence[dict]) -> list[float]:
    """Each prompt's speculative tokens/s over its target-only tokens/s (aligned lists): the
    spread behind a pooled wall-clock speedup."""
    out = []
    for s, b in zip(spec, target_only):
        x = speedup(_tokens_per_s([s]), _tokens_per_s([b]))
        if x is not None:
            out.append(x)
    return out


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lossless_match_rate(spec_tokens: Sequence[Sequence[int]], ref_tokens: Sequence[Sequence[int]]):
    """Fraction of prompts whose speculative output equals the reference token for token."""
    if not spec_tokens:
        return None
    same = sum(first_mismatch(a, b) is None for a, b in zip(spec_tokens, ref_tokens))
    return same / len(spec_tokens)


def paired_acceptance_diff(
    a: Sequence[dict], b: Sequence[dict], n_boot: int = 2000, seed: int = 0
) -> dict | None:
    """Acceptance rate of draft a minus draft b on the same prompts, with a 95% interval.

    a[i] and b[i] are the two drafts' results on prompt i. The interval is a paired
    percentile bootstrap over prompts: resample prompt indices with replacement, recompute
    both pooled rates (accepted / proposed) on the same resample, take the 2.5th and 97.5th
    percentiles of the difference. Pairing matters: prompts differ far more in how
    predictable they are than two drafts differ on one prompt, so an unpaired interval
    would be several times wider. `share_a_better` is the share of resamples where a > b.
    """
    if len(a) != len(b) or not a:
        return None
    acc_a = [r["accepted"] for r in a]
    acc_b = [r["accepted"] for r in b]
    prop_a = [r["proposed"] for r in a]
    prop_b = [r["proposed"] for r in b]

    def diff(idx: Sequence[int]) -> float | None:
        pa, pb = sum(prop_a[i] for i in idx), sum(prop_b[i] for i in idx)
        if not pa or not pb:
            return None
        return sum(acc_a[i] for i in idx) / pa - sum(acc_b[i] for i in idx) / pb

    point = diff(range(len(a)))
    if point is None:
        return None
    rng = random.Random(seed)
    n = len(a)
    boots = sorted(
        d
        for d in (diff([rng.randrange(n) for _ in range(n)]) for _ in range(n_boot))
        if d is not None
    )
    return {
        "diff": point,
        "ci95": [boots[int(0.025 * (len(boots) - 1))], boots[int(0.975 * (len(boots) - 1))]],
        "share_a_better": sum(d > 0 for d in boots) / len(boots),
        "num_prompts": n,
        "n_boot": len(boots),
    }
