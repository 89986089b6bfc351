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


def draft_share(drafts: float, c: float, verify_cost: float) -> float:
    """d c / (d c + v): the share of a round's modelled time that its d draft steps take (c a
    draft step, v the verify forward, both in 1-token target forwards)."""
    return drafts * c / (drafts * c + verify_cost)


def free_draft_speedup(tokens_per_round: float, verify_cost: float) -> float:
    """tokens / v: the modelled speedup of the same rounds with draft steps that cost
    nothing. No cheaper draft proposing the same tokens, and no decoder running the same
    rounds faster, can do better: a round still costs its verify forward. Only more tokens
    per round lift it (a better-aligned draft, or more candidates verified per forward)."""
    return tokens_per_round / verify_cost


def modelled_request_speedup(
    steady: float | None,
    tokens: int,
    target_step_s: float | None,
    target_prefill_s: float | None,
    draft_prefill_s: float | None,
) -> float | None:
    """The per-round model carried over whole requests: prefills are paid once per request,
    the draft's own among them, and do not speed up. Over prompts (sums):
    (P_t + N t) / (P_t + P_d + N t / steady), N tokens, t one target step, P_t and P_d the
    target's and the draft's prompt prefills."""
    if None in (steady, target_step_s, target_prefill_s, draft_prefill_s) or not steady:
        return None
    decode = tokens * target_step_s
    return (target_prefill_s + decode) / (target_prefill_s + draft_prefill_s + decode / steady)


def _sum(results: Iterable[dict], key: str) -> float:
    return sum(r[key] for r in results)


def _sum_lists(results: Sequence[dict], key: str) -> list[int]:
    width = max((len(r[key]) for r in results), default=0)
    out = [0] * width
    for r in results:
        for i, v in enumerate(r[key]):
            out[i] += v
    return out


def _sum_recorded(results: Sequence[dict], key: str) -> float | None:
    """The sum of a field that results cached before it was recorded lack: None then."""
    return sum(r[key] for r in results) if all(key in r for r in results) else None


def _tokens_per_s(results: Sequence[dict]) -> float | None:
    return tokens_per_second(sum(len(r["tokens"]) for r in results), _sum(results, "wall_time"))


def summarize(
    spec: Sequence[dict],
    target_only: Sequence[dict],
    k: int,
    prompt_ids: Sequence[Sequence[int]] | None = None,
) -> dict:
    """One summary over matching per-prompt results (same prompts, same order); with the
    prompts' ids, also acceptance on the tokens that copy the prompt and on the rest."""
    tokens = sum(len(r["tokens"]) for r in spec)
    proposed, accepted = int(_sum(spec, "proposed")), int(_sum(spec, "accepted"))
    forwards = int(_sum(spec, "target_forwards"))
    accepted_at, reached_at = _sum_lists(spec, "accepted_at"), _sum_lists(spec, "reached_at")
    a = alpha(accepted_at, reached_at)
    base_time, base_n = (
        _sum(target_only, "target_1tok_time"),
        int(_sum(target_only, "target_1tok_n")),
    )
    draft_n = int(_sum(spec, "draft_1tok_n"))
    c = cost_ratio(_sum(spec, "draft_1tok_time"), draft_n, base_time, base_n)
    tps, base_tps = _tokens_per_s(spec), _tokens_per_s(target_only)
    verify_n = int(_sum(spec, "target_verify_n"))
    v = cost_ratio(_sum(spec, "target_verify_time"), verify_n, base_time, base_n)
    steady = modelled_speedup(a, k, c, v) if v is not None else None
    step_s = _ratio(base_time, base_n) if base_n else None  # one target decode step
    request = modelled_request_speedup(
        steady,
        tokens,
        step_s,
        _sum_recorded(target_only, "target_prefill_time"),
        _sum_recorded(spec, "draft_prefill_time"),
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
        "modelled_speedup_verify": steady,
        "draft_forward_ms": 1e3 * _ratio(_sum(spec, "draft_1tok_time"), draft_n)
        if draft_n
        else None,
        "target_forward_ms": 1e3 * step_s if step_s is not None else None,
        "target_verify_ms": (
            1e3 * _ratio(_sum(spec, "target_verify_time"), verify_n) if verify_n else None
        ),
        "modelled_speedup_request": request,
        **echo_split(spec, prompt_ids),
        **confidence_split(spec, target_only),
    }


def per_category(
    spec: Sequence[dict],
    target_only: Sequence[dict],
    categories: Sequence[str],
    k: int,
    prompt_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, dict]:
    """summarize() for each category; the sequences are aligned by prompt."""
    out = {}
    for cat in sorted(set(categories)):
        idx = [i for i, c in enumerate(categories) if c == cat]
        ids = None if prompt_ids is None else [prompt_ids[i] for i in idx]
        out[cat] = summarize([spec[i] for i in idx], [target_only[i] for i in idx], k, ids)
    return out


# A token "echoes" the prompt when it lies in a run of at least ECHO_NGRAM output tokens that
# also occurs in the prompt: re-typed docstrings and signatures (HumanEval), quoted text
# (extraction). Any draft that has read the prompt guesses those; acceptance on the rest is
# what says whether a draft predicts new text.
ECHO_NGRAM = 4


def echo_mask(prompt_ids: Sequence[int], tokens: Sequence[int], n: int = ECHO_NGRAM) -> list[bool]:
    """Per output token: does it lie in a run of >= n output tokens found in the prompt?"""
    prompt, out = list(prompt_ids), list(tokens)
    grams = {tuple(prompt[j : j + n]) for j in range(len(prompt) - n + 1)}
    mask = [False] * len(out)
    for j in range(len(out) - n + 1):
        if tuple(out[j : j + n]) in grams:
            mask[j : j + n] = [True] * n
    return mask


def echo_split(spec: Sequence[dict], prompt_ids: Sequence[Sequence[int]] | None) -> dict:
    """echo_share (output tokens that copy the prompt / all output tokens) and alpha on each
    side: accepted / judged drafts at echo positions (alpha_echo) and elsewhere (alpha_new).
    Empty without prompts or without per-token outcomes (results cached before they were kept)."""
    if prompt_ids is None or any(r.get("outcome") is None for r in spec):
        return {}
    judged, accepted = {True: 0, False: 0}, {True: 0, False: 0}
    echoes = tokens = 0
    for r, ids in zip(spec, prompt_ids):
        mask = echo_mask(ids, r["tokens"])
        echoes, tokens = echoes + sum(mask), tokens + len(mask)
        for outcome, echo in zip(r["outcome"], mask):
            judged[echo] += outcome >= 0
            accepted[echo] += outcome == 1
    return {
        "echo_share": _ratio(echoes, tokens),
        "alpha_echo": _ratio(accepted[True], judged[True]),
        "alpha_new": _ratio(accepted[False], judged[False]),
    }


# The target is "sure" of its own token where it gives it at least this probability. The
# draft's misses where it is not are choices among continuations the target itself finds
# close: a draft learns those only by learning the target's own preferences, which takes
# far more teacher tokens than fixing what the target is sure of (README "Where the misses
# are").
TARGET_SURE = 0.8


def confidence_split(spec: Sequence[dict], target_only: Sequence[dict]) -> dict:
    """Judged drafts split by the target's probability of its own token at that position
    (target_only rows' "target_p", aligned with their tokens): target_sure_share (judged
    drafts where it is >= TARGET_SURE / all judged), alpha on each side, and
    misses_target_unsure (rejected drafts where the target was unsure / all rejected).
    Positions count while a row's tokens equal the target's (a greedy output that left it
    at a near-tie is counted up to there). Empty where the probabilities were not measured."""
    if any(b.get("target_p") is None for b in target_only) or any(
        r.get("outcome") is None for r in spec
    ):
        return {}
    judged, accepted = {True: 0, False: 0}, {True: 0, False: 0}
    for r, b in zip(spec, target_only):
        for outcome, tok, ref, p in zip(r["outcome"], r["tokens"], b["tokens"], b["target_p"]):
            if tok != ref:
                break
            sure = p >= TARGET_SURE
            judged[sure] += outcome >= 0
            accepted[sure] += outcome == 1
    missed = {sure: judged[sure] - accepted[sure] for sure in (True, False)}
    return {
        "target_sure_share": _ratio(judged[True], judged[True] + judged[False]),
        "alpha_target_sure": _ratio(accepted[True], judged[True]),
        "alpha_target_unsure": _ratio(accepted[False], judged[False]),
        "misses_target_unsure": _ratio(missed[False], missed[True] + missed[False]),
    }


def token_outcomes(accepted: int, reached: int, emitted: int) -> list[int]:
    """Per token a round emits: 1 for its `accepted` drafts, then for the token after them
    0 when its draft was judged (reached > accepted: rejected) and -1 when none was (the
    bonus token, or no draft at all)."""
    tail = [0 if reached > accepted else -1] if emitted > accepted else []
    return [1] * accepted + tail


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
    out["outcome"] = []  # per output token, as token_outcomes
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
        out["outcome"] += token_outcomes(emitted, reached, min(acc + 1, n - i))
        i += acc + 1
    return out


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
    """Acceptance rate and alpha of draft a minus draft b on the same prompts, with 95%
    intervals.

    a[i] and b[i] are the two drafts' results on prompt i. The interval is a paired
    percentile bootstrap over prompts: resample prompt indices with replacement, recompute
    both pooled ratios (accepted / proposed; alpha: accepted / judged) on the same resample,
    take the 2.5th and 97.5th percentiles of the difference. Pairing matters: prompts differ
    far more in how predictable they are than two drafts differ on one prompt, so an
    unpaired interval would be several times wider. `share_a_better` is the share of
    resamples where a's acceptance rate is higher.
    """
    if len(a) != len(b) or not a:
        return None
    acc_a, acc_b = [r["accepted"] for r in a], [r["accepted"] for r in b]
    rates = _Paired(acc_a, [r["proposed"] for r in a], acc_b, [r["proposed"] for r in b])
    judged = all("reached_at" in r for r in (*a, *b))  # counts of a replay or the engine
    alphas = None
    if judged:
        den_a, den_b = [sum(r["reached_at"]) for r in a], [sum(r["reached_at"]) for r in b]
        alphas = _Paired(acc_a, den_a, acc_b, den_b)
    point = rates.diff(range(len(a)))
    if point is None:
        return None
    rng = random.Random(seed)
    n = len(a)
    samples = [[rng.randrange(n) for _ in range(n)] for _ in range(n_boot)]
    boots = sorted(d for d in map(rates.diff, samples) if d is not None)
    alpha_boots = sorted(d for d in map(alphas.diff, samples) if d is not None) if alphas else []
    return {
        "diff": point,
        "ci95": _percentile_interval(boots),
        "share_a_better": sum(d > 0 for d in boots) / len(boots),
        "alpha_diff": alphas.diff(range(n)) if alphas else None,
        "alpha_ci95": _percentile_interval(alpha_boots) if alpha_boots else None,
        "num_prompts": n,
        "n_boot": len(boots),
    }


def paired_diff_by_category(
    a: Sequence[dict], b: Sequence[dict], n_boot: int = 2000, seed: int = 0
) -> dict | None:
    """paired_acceptance_diff over all prompts and, when they span several categories, in
    each category on its own ("per_category"): a draft may gain on one kind of content and
    lose on another, which the pooled figure hides."""
    out = paired_acceptance_diff(a, b, n_boot, seed)
    cats = sorted({r["category"] for r in a if "category" in r})
    if out is not None and len(cats) > 1:
        out["per_category"] = {}
        for cat in cats:
            idx = [i for i, x in enumerate(a) if x["category"] == cat]
            if len(idx) < MIN_CATEGORY_PROMPTS:  # a bootstrap over 1-4 prompts says nothing
                continue
            sub_a, sub_b = [a[i] for i in idx], [b[i] for i in idx]
            out["per_category"][cat] = paired_acceptance_diff(sub_a, sub_b, n_boot, seed)
    return out


# Per-category intervals need a few prompts to resample: fewer than this, none is given.
MIN_CATEGORY_PROMPTS = 5


class _Paired:
    """Two drafts' per-prompt numerators and denominators: the pooled ratio difference on
    any multiset of prompt indices."""

    def __init__(self, num_a, den_a, num_b, den_b):
        self.num_a, self.den_a, self.num_b, self.den_b = num_a, den_a, num_b, den_b

    def diff(self, idx: Iterable[int]) -> float | None:
        idx = list(idx)
        da, db = sum(self.den_a[i] for i in idx), sum(self.den_b[i] for i in idx)
        if not da or not db:
            return None
        return sum(self.num_a[i] for i in idx) / da - sum(self.num_b[i] for i in idx) / db


def _percentile_interval(sorted_values: Sequence[float]) -> list[float]:
    m = len(sorted_values) - 1
    return [sorted_values[int(0.025 * m)], sorted_values[int(0.975 * m)]]
