"""What both evaluate backends (native and vLLM) do once the tokens are decoded.

The greedy losslessness check, the ranking of leaderboard rows, the k-sweep entries and
the recommended k, and where a draft's files are. Neither backend imports the other;
both import this.

The recommended k rests on what holds still between runs (issue 15: identical runs on this
shared machine timed k=1 at 0.16x to 1.44x): per-k acceptance, which is deterministic, and
draft/verify costs measured as medians of interleaved repeats (evaluate/timing.py on
draftsmith/clock.py), through the cost-aware model metrics.modelled_speedup(alpha, k, c, v).
The wall-clock speedup is reported beside it with its spread, never used to choose while a
model figure exists.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.clock import quartiles
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import metrics
from draftsmith.evaluate.records import DraftEntry, LeaderboardRow, is_fixed_k
from draftsmith.evaluate.report import METRIC_KEYS
from draftsmith.models import resolve_model


def target_tie_gap(target, prompt_ids, own: Sequence[int], other: Sequence[int], pos: int):
    """The target's relative logit gap between its own token `own[pos]` and `other[pos]`
    after the shared prefix, from one forward over prompt + prefix (a third summation order
    beside a verify pass and a 1-token decode). None where one output merely ends earlier."""
    if pos >= min(len(own), len(other)):
        return None
    ids = list(prompt_ids) + list(own[:pos])
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ids], device=target.device), logits_to_keep=1)
    logits = out.logits[0, -1].float()  # (V,)
    mine, theirs = logits[own[pos]], logits[other[pos]]
    return ((mine - theirs).abs() / mine.abs().clamp_min(1.0)).item()


def near_tie_tolerance(dtype) -> float:
    """How close two logits may be for another summation order to argmax otherwise:
    sqrt of the dtype's machine epsilon, relative (3.5e-4 fp32, 0.088 bf16)."""
    return math.sqrt(torch.finfo(dtype).eps)


def check_lossless(
    name: str,
    spec: list[dict],
    base: list[dict],
    on_mismatch: str,
    tie_gap=None,
    tolerance: float = 0.0,
    where: str = "",
) -> tuple[float, list[dict]]:
    """Greedy speculative output must equal target-only output: (match rate, near-ties).

    At a prompt's first divergence `tie_gap(spec_item, base_item, pos)` (None: no target to
    ask) gives the target's own relative logit gap between its token and the speculative one.
    Within `tolerance` the two passes merely rounded a near-tie differently (a (k+1)-token
    verify pass and a 1-token decode sum in other orders; in bf16 that flips real ties):
    recorded, not an error. Anything else is a verification bug: raised (or warned) naming
    the prompt, the position and the gap.
    """
    ties, bugs = [], []
    for s, b in zip(spec, base):
        pos = metrics.first_mismatch(s["tokens"], b["tokens"])
        if pos is None:
            continue
        gap = tie_gap(s, b, pos) if tie_gap is not None else None
        found = {"id": s["id"], "position": pos, "gap": gap}
        (ties if gap is not None and gap <= tolerance else bugs).append(found)
    rate = metrics.lossless_match_rate([s["tokens"] for s in spec], [b["tokens"] for b in base])
    if bugs:
        first = bugs[0]
        gap = "" if first["gap"] is None else f", target logit gap {first['gap']:.3g}"
        msg = (
            f"{name}: greedy speculative output differs from target-only output on {len(bugs)} of "
            f"{len(spec)} prompts (first: prompt {first['id']!r} at new token {first['position']}"
            f"{gap}, beyond the near-tie tolerance {tolerance:.3g}){where}"
        )
        if on_mismatch == "error":
            raise DraftsmithError(
                msg + "; set evaluate.on_mismatch=warn if the kernels are nondeterministic"
            )
        warnings.warn(msg, stacklevel=2)
        print(f"[evaluate] WARNING {msg}")
    return rate, ties


def rankable(rows: list[LeaderboardRow]) -> list[LeaderboardRow]:
    """Rows that may rank and be exported: all but the target drafting for itself (a sanity
    check, evaluate.baselines: [target], which would always win)."""
    out = [r for r in rows if r.role != "sanity"]
    if rows and not out:
        raise DraftsmithError(
            "evaluate.baselines: only the target drafting for itself is there to evaluate; "
            "run `draftsmith distill CONFIG` first or name a draft to compare"
        )
    return out


def pick_best(rows: list[LeaderboardRow], metric: str) -> LeaderboardRow:
    """The row with the highest `metric` (missing values rank last; ties keep the earlier row)."""

    def value(r: LeaderboardRow) -> float:
        v = getattr(r, metric)
        return -float("inf") if v is None else v

    return max(rows, key=value)


def sweep_entry(row: LeaderboardRow) -> dict:
    """One k-sweep point: k and the row's metrics (the leaderboard table's columns)."""
    return {"k": row.num_speculative_tokens, **{key: getattr(row, key) for key in METRIC_KEYS}}


def modelled_quartiles(a: float | None, k: int, costs: dict) -> tuple[list, list] | None:
    """[q25, median, q75] over the timing repeats of the modelled speedup at k, without and
    with the verify cost: each repeat's c and v_k through metrics.modelled_speedup."""
    if a is None:
        return None
    cs, vs = costs["c"], costs["v"][str(k)]
    plain = [metrics.modelled_speedup(a, k, c) for c in cs]
    verify = [metrics.modelled_speedup(a, k, c, v) for c, v in zip(cs, vs)]
    return quartiles(plain), quartiles(verify)


def costed_sweep_entry(
    acceptance: LeaderboardRow, engine: LeaderboardRow | None, costs: dict | None
) -> dict:
    """One native k-sweep point, each figure from where it is best measured: acceptance from
    `acceptance` (a row over every prompt of the set: the teacher-forced replay when greedy),
    wall clock from `engine` (a row over the engine's prompts, with the interquartile range
    of its per-prompt speedups) and c, v and the modelled speedups from the timed `costs`
    (medians, with their interquartile ranges)."""
    k = acceptance.num_speculative_tokens
    entry = {
        **sweep_entry(acceptance),
        "num_prompts": acceptance.num_prompts,
        "acceptance_measured_by": acceptance.measured_by,
    }
    for key in ("speedup", "speedup_iqr", "tokens_per_s", "lossless_match_rate"):
        entry[key] = getattr(engine, key) if engine else None
    entry["engine_prompts"] = engine.num_prompts if engine else 0
    # The same model fed the engine run's own alpha and forward timers, on its prompts: the
    # check of the formula against this wall clock, apart from any drift between the timed
    # costs and the run, or between the engine's prompts and the whole set.
    entry["modelled_speedup_in_run"] = engine.modelled_speedup_verify if engine else None
    # ... and with the run's prompt prefills (the draft's own among them) counted
    entry["modelled_request_in_run"] = engine.modelled_speedup_request if engine else None
    entry["per_category"] = category_points(acceptance, engine, k, costs)
    model = modelled_quartiles(acceptance.alpha, k, costs) if costs else None
    if model is not None:
        plain, verify = model
        c, v = costs["draft_cost_ratio"], costs["verify_cost_ratio"][str(k)]
        tokens = metrics.expected_tokens_per_round(acceptance.alpha, k)
        entry |= {
            "draft_cost_ratio": c[1],
            "draft_cost_iqr": [c[0], c[2]],
            "verify_cost_ratio": v[1],
            "verify_cost_iqr": [v[0], v[2]],
            "modelled_speedup": plain[1],
            "modelled_speedup_verify": verify[1],
            "modelled_speedup_iqr": [verify[0], verify[2]],
            **draft_limits(tokens, k, costs["c"], costs["v"][str(k)]),
        }
    return entry


def draft_limits(tokens: float, drafts: float, cs: list[float], vs: list[float]) -> dict:
    """What the draft's own cost takes from a sweep point of `tokens` per round and `drafts`
    draft steps per round, per timing repeat (c, v), medians: {"draft_share": the share of
    a round spent drafting, "modelled_speedup_free_draft": the same rounds with free draft
    steps, the ceiling for any cheaper draft proposing the same tokens}."""
    return {
        "draft_share": quartiles([metrics.draft_share(drafts, c, v) for c, v in zip(cs, vs)])[1],
        "modelled_speedup_free_draft": quartiles(
            [metrics.free_draft_speedup(tokens, v) for v in vs]
        )[1],
    }


def category_points(
    acceptance: LeaderboardRow, engine: LeaderboardRow | None, k: int, costs: dict | None
) -> dict:
    """A fixed-k sweep point split by category, where the set has several: each category's
    alpha over its own prompts, the modelled speedup at k from that alpha and the same timed
    costs (one draft, one target, one machine: only acceptance differs by content), and the
    engine's wall clock on its prompts of that category. {} for a set of one category."""
    if len(acceptance.per_category) < 2:
        return {}
    out = {}
    for cat, m in sorted(acceptance.per_category.items()):
        eng = engine.per_category.get(cat) if engine else None
        point = {
            "alpha": m.alpha,
            "mean_accepted_length": m.mean_accepted_length,
            "num_prompts": m.num_prompts,
            "speedup": eng.speedup if eng else None,
            "engine_prompts": eng.num_prompts if eng else 0,
            "modelled_speedup_verify": None,
            "modelled_speedup_iqr": None,
        }
        model = modelled_quartiles(m.alpha, k, costs) if costs else None
        if model is not None:
            verify = model[1]
            point["modelled_speedup_verify"] = verify[1]
            point["modelled_speedup_iqr"] = [verify[0], verify[2]]
        out[cat] = point
    return out


def dynamic_sweep_entry(row: LeaderboardRow, costs: dict | None) -> dict:
    """One sweep point of dynamic lookahead (a round drafts until the draft's confidence
    falls under `stop_threshold`, at most k): everything from the engine's row, the modelled
    speedup from its measured rounds and the timed costs.

    The fixed-k model assumes k drafts per round; here a round drafts d = proposed / rounds
    on average, so the cost of a round is d c + v, v taken at the smallest swept width that
    holds d drafts and the round's l second-choice leaves (an overestimate: v grows with
    width; past the widest swept, the widest, an underestimate), and the gain is the
    measured tokens per target forward: modelled = tokens_per_forward / (d c + v), per
    timing repeat. Points with leaves (`second_choice_min`) are this same model: the leaves
    cost verify rows, no draft steps.
    """
    leaves = row.second_choices or {}
    entry = {
        **sweep_entry(row),
        "stop_threshold": row.stop_threshold,
        "second_choice_min": row.second_choice_min,
        "second_choices_emitted": leaves.get("accepted"),
        "second_choices_verified": leaves.get("proposed"),
        "num_prompts": row.num_prompts,
        "acceptance_measured_by": row.measured_by,
        "speedup_iqr": row.speedup_iqr,
        "engine_prompts": row.num_prompts,
        "modelled_speedup": None,
        "modelled_speedup_verify": None,
    }
    forwards, tpf = row.target_forwards, row.mean_accepted_length
    if not costs or not forwards or tpf is None:
        return entry
    d = row.tokens_proposed / forwards
    width = d + leaves.get("proposed", 0) / forwards  # rows beside seq[-1]
    swept = sorted(int(k) for k in costs["v"])
    k_v = next((k for k in swept if k >= width), swept[-1])
    cs, vs = costs["c"], costs["v"][str(k_v)]
    verify = quartiles([tpf / (d * c + v) for c, v in zip(cs, vs)])
    entry |= {
        "drafts_per_round": d,
        "draft_cost_ratio": costs["draft_cost_ratio"][1],
        "verify_cost_ratio": costs["verify_cost_ratio"][str(k_v)][1],
        "modelled_speedup": quartiles([tpf / (d * c + 1) for c in cs])[1],
        "modelled_speedup_verify": verify[1],
        "modelled_speedup_iqr": [verify[0], verify[2]],
        **draft_limits(tpf, d, cs, vs),
    }
    return entry


# The figures a k can be chosen by, most stable first, each with its spread's key.
K_RULES = (
    ("modelled_speedup_verify", "modelled_speedup_iqr"),
    ("speedup", "speedup_iqr"),
    ("modelled_speedup", None),
)


def _separated(a: dict, b: dict, key: str, spread: str | None) -> bool:
    """a ranks above b beyond their spreads: a's interquartile range lies above b's."""
    if spread is None or a.get(spread) is None or b.get(spread) is None:
        return a[key] > b[key]
    return a[spread][0] > b[spread][1]


def rank_ks(sweep: list[dict], key: str, spread: str | None) -> dict | None:
    """{"k", "value", "iqr", "by", "clear", "runner_up", ...}: the k with the highest `key`
    (its `value` and spread `iqr`; ties: the smaller k); clear unless its spread overlaps the
    runner-up's. None when no entry has `key`."""
    pool = sorted(
        (s for s in sweep if s.get(key) is not None),
        key=lambda s: (
            -s[key],
            s["k"],
            s.get("stop_threshold") or 0.0,
            s.get("second_choice_min") or 0.0,
        ),
    )
    if not pool:
        return None
    second = pool[1] if len(pool) > 1 else None
    return {
        "k": pool[0]["k"],
        "value": pool[0][key],  # its figure: a speedup over the target alone
        "iqr": pool[0].get(spread) if spread else None,
        "stop_threshold": pool[0].get("stop_threshold"),  # None: a fixed k
        "second_choice_min": pool[0].get("second_choice_min"),  # None: a chain
        "by": key,
        "clear": second is None or _separated(pool[0], second, key, spread),
        "runner_up": second["k"] if second else None,
        "runner_up_stop_threshold": second.get("stop_threshold") if second else None,
    }


def below_one(ranked: dict) -> bool:
    """A rank_ks winner's figure is under 1.0x beyond its spread (its interquartile range's
    top; the figure itself where it has none)."""
    return (ranked["iqr"][1] if ranked["iqr"] else ranked["value"]) < 1.0


def pays(best: dict, sweep: list[dict]) -> dict:
    """{"pays", "pays_by"}: whether speculative decoding beats the target alone at all.

    No, when the best point of the sweep (`best`, ranked by the figure that chose) is at or
    below 1.0x, or when the wall clock's best point ran below 1.0x beyond its spread: the
    model can miss what a real run pays (each request's prefills, a machine whose verify is
    compute-bound), and a measured slowdown outranks a modelled gain. Where a verify pass over
    k+1 tokens costs several decode steps (emulated bf16 on an AVX2 CPU) no k pays, and the
    draft to serve with is none."""
    if best["value"] <= 1.0:
        return {"pays": False, "pays_by": best["by"]}
    measured = rank_ks(sweep, "speedup", "speedup_iqr") if best["by"] != "speedup" else None
    if measured is not None and below_one(measured):
        return {"pays": False, "pays_by": "speedup", "measured": measured}
    return {"pays": True, "pays_by": best["by"]}


def recommend_k(sweep: list[dict]) -> dict:
    """The k to serve with: the highest modelled speedup with the timed verify cost (the
    measured speedup only where no model figure exists: vLLM), ties to the smaller k.

    Returns {"k", "by", "value", "clear", "runner_up", "wall_clock", "dynamic", "pays"}:
    `k` is the best fixed k (what vLLM's speculative_config takes); `by` names the figure
    that chose and `value` is k's; `clear` is False when the spreads are too wide to rank the
    winner above the runner-up; `wall_clock` ranks the measured speedups the same way,
    reported beside the recommendation, not used for it; `dynamic` is the best point with
    dynamic lookahead or second-choice leaves ({"k", "stop_threshold", "second_choice_min",
    ...}) when one ranks above every fixed k, else None; `pays` is False when no point of the
    sweep is faster than the target alone (`pays`: by the figure that chose, or measured).
    """
    fixed = [s for s in sweep if is_fixed_k(s)]
    for key, spread in K_RULES:
        choice = rank_ks(fixed, key, spread)
        if choice is not None:
            overall = rank_ks(sweep, key, spread)
            dynamic = None if is_fixed_k(overall) else overall
            wall = rank_ks(fixed, "speedup", "speedup_iqr")
            return {**choice, "wall_clock": wall, "dynamic": dynamic, **pays(overall, sweep)}
    # nothing timed at all (no tokens decoded): the first k swept, marked unranked
    first = fixed[0] if fixed else sweep[0]
    return {
        "k": first["k"],
        "by": None,
        "clear": False,
        "runner_up": None,
        "wall_clock": None,
        "dynamic": None,
        "pays": None,  # not known: nothing timed
    }


def recommend_k_by_category(sweep: list[dict]) -> dict:
    """{category: {"k", "by", "clear", "runner_up", "alpha", "modelled_speedup_verify",
    "speedup", "pays"}}: recommend_k's rule applied to each category's own fixed-k points
    (category_points), for a server that sees mostly one kind of content. Acceptance
    differs by content (code is re-typed, prose is not), so the best k does too; the costs
    are the run's. {} when the sweep has no categories (one-category sets, vLLM)."""
    fixed = [s for s in sweep if is_fixed_k(s)]
    cats = sorted({cat for s in fixed for cat in s.get("per_category") or {}})
    out = {}
    for cat in cats:
        points = [
            {"k": s["k"], **s["per_category"][cat]}
            for s in fixed
            if cat in (s.get("per_category") or {})
        ]
        for key, spread in K_RULES:
            choice = rank_ks(points, key, spread)
            if choice is not None:
                best = next(p for p in points if p["k"] == choice["k"])
                figures = ("alpha", "modelled_speedup_verify", "speedup", "engine_prompts")
                # by the model alone: a category's wall clock is one or two prompts' reading
                faster = choice["value"] > 1.0
                out[cat] = {**choice, **{f: best.get(f) for f in figures}, "pays": faster}
                break
    return out


def draft_path(draft: DraftEntry) -> str:
    """The directory a draft's weights are in (a registry name is pulled first)."""
    return str(Path(draft.ref)) if Path(draft.ref).exists() else resolve_model(draft.ref)
