"""evaluate.backend = "vllm": each draft through vLLM's speculative decoding, on GPU at scale.

    LLM(model=target, speculative_config={"method": "draft_model", "model": draft_dir,
        "num_speculative_tokens": k}, disable_log_stats=False)

generates each eval set's prompts (one generate call per category, all its prompts batched), and
`llm.get_metrics()` (vllm.v1.metrics.reader: Counter with .value, Vector with .values) is read
before and after each call:

    vllm:spec_decode_num_drafts                    verify steps      -> target_forwards
    vllm:spec_decode_num_draft_tokens              proposed tokens   -> tokens_proposed
    vllm:spec_decode_num_accepted_tokens           accepted tokens   -> tokens_accepted
    vllm:spec_decode_num_accepted_tokens_per_pos   accepted at pos i -> per_position_acceptance

Caveats, measured not hidden: vLLM's draft proposes by argmax, so at temperature > 0 its
acceptance is not the exact-sampling figure the native engine measures; tokens/s is batched
throughput, not batch-1 latency; the draft cost ratio is not observable (None), so neither is
the modelled speedup, and the recommended k follows the measured speedup; there are no
per-prompt counts, so no teacher-forced ranking and no paired comparisons: every draft runs
on every set (rows: `measured_by` "engine"); greedy outputs are compared with a target-only
vLLM run, and batched GPU kernels can differ on near-ties (use evaluate.on_mismatch=warn).
"""

from __future__ import annotations

import gc
import time

from draftsmith.config import Config
from draftsmith.evaluate import metrics
from draftsmith.evaluate.ranking import (
    check_lossless,
    draft_path,
    pick_best,
    rankable,
    sweep_entry,
)
from draftsmith.evaluate.records import VLLM, DraftEntry, LeaderboardRow, MetricSummary
from draftsmith.kinds import kind_of
from draftsmith.models import resolve_model
from draftsmith.vllm_compat import engine_kwargs, import_vllm

SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counts(metric_list, k: int) -> dict:
    """Sum the spec-decode counters (over label sets, e.g. engines) of one get_metrics() call."""
    counts = {
        "num_drafts": 0,
        "num_draft_tokens": 0,
        "num_accepted_tokens": 0,
        "accepted_per_pos": [0] * k,
    }
    for metric in metric_list:
        if metric.name in SPEC_METRICS:
            counts[SPEC_METRICS[metric.name]] += int(metric.value)
        elif metric.name == PER_POS:
            for i, v in enumerate(metric.values[:k]):
                counts["accepted_per_pos"][i] += int(v)
    return counts


def counts_delta(after: dict, before: dict) -> dict:
    """Counters are cumulative over the LLM's life: the difference is one call's share."""
    out = {key: after[key] - before[key] for key in SPEC_METRICS.values()}
    out["accepted_per_pos"] = [
        a - b for a, b in zip(after["accepted_per_pos"], before["accepted_per_pos"])
    ]
    return out


def summary_from_counts(
    counts: dict, k: int, tokens: int, wall: float, base_tokens: int, base_wall: float
) -> dict:
    """The leaderboard's row fields from vLLM counters and wall-clock throughput."""
    per_pos = counts["accepted_per_pos"]
    # position i is verified whenever position i-1 was accepted (position 0: every draft)
    reached = [counts["num_drafts"]] + per_pos[:-1]
    tps = metrics.tokens_per_second(tokens, wall)
    base_tps = metrics.tokens_per_second(base_tokens, base_wall)
    drafts = counts["num_drafts"]
    return {
        "tokens_generated": tokens,
        "tokens_proposed": counts["num_draft_tokens"],
        "tokens_accepted": counts["num_accepted_tokens"],
        "acceptance_rate": metrics.acceptance_rate(
            counts["num_accepted_tokens"], counts["num_draft_tokens"]
        ),
        "alpha": metrics.alpha(per_pos, reached),
        "mean_accepted_length": 1.0 + counts["num_accepted_tokens"] / drafts if drafts else None,
        "per_position_acceptance": metrics.per_position_acceptance(per_pos, reached),
        "target_forwards": drafts,
        "tokens_per_s": tps,
        "target_tokens_per_s": base_tps,
        "speedup": metrics.speedup(tps, base_tps),
        "draft_cost_ratio": None,
        "verify_cost_ratio": None,
        "modelled_speedup": None,
        "modelled_speedup_verify": None,
    }


# ----------------------------------------------------------------------------- running vLLM


def _make_llm(vllm, cfg: Config, target: str, spec: dict | None):
    """vllm.LLM for the target; `spec`: the draft's speculative_config (None: target-only)."""
    kw = engine_kwargs(cfg, cfg.evaluate.vllm, target)
    return vllm.LLM(**kw, speculative_config=spec, disable_log_stats=False)


def _release(llm) -> None:
    del llm
    gc.collect()
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort between engines
        pass


def _generate_by_category(vllm, llm, prompts: list[dict], cfg: Config, k: int):
    """{category: (counts, tokens, wall, outputs)}; outputs aligned with that category's prompts."""
    from vllm.inputs import TokensPrompt

    ev = cfg.evaluate
    params = vllm.SamplingParams(
        temperature=ev.temperature,
        top_p=ev.top_p,
        top_k=ev.top_k if ev.top_k > 0 else -1,
        max_tokens=ev.max_new_tokens,
        seed=cfg.run.seed,
    )
    out = {}
    for cat in sorted({p["category"] for p in prompts}):
        group = [p for p in prompts if p["category"] == cat]
        before = spec_counts(llm.get_metrics(), k)
        start = time.perf_counter()
        res = llm.generate(
            [TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in group], params, use_tqdm=False
        )
        wall = time.perf_counter() - start
        after = spec_counts(llm.get_metrics(), k)
        toks = [list(r.outputs[0].token_ids) for r in res]
        out[cat] = (counts_delta(after, before), sum(map(len, toks)), wall, toks)
    return out


def _row(
    draft: DraftEntry, path: str, runs: dict, base: dict, cfg: Config, k: int, eval_set: str
) -> LeaderboardRow:
    total = {
        "num_drafts": 0,
        "num_draft_tokens": 0,
        "num_accepted_tokens": 0,
        "accepted_per_pos": [0] * k,
    }
    per_cat, spec_toks, ref_toks = {}, [], []
    tokens = wall = base_tokens = base_wall = 0
    for cat, (counts, n_tok, secs, toks) in runs.items():
        _, b_tok, b_wall, b_out = base[cat]
        per_cat[cat] = MetricSummary(
            **summary_from_counts(counts, k, n_tok, secs, b_tok, b_wall), num_prompts=len(toks)
        )
        for key in SPEC_METRICS.values():
            total[key] += counts[key]
        total["accepted_per_pos"] = [
            a + b for a, b in zip(total["accepted_per_pos"], counts["accepted_per_pos"])
        ]
        tokens, wall, base_tokens, base_wall = (
            tokens + n_tok,
            wall + secs,
            base_tokens + b_tok,
            base_wall + b_wall,
        )
        spec_toks += toks
        ref_toks += b_out
    row = LeaderboardRow(
        checkpoint=draft.name,
        kind=kind_of(draft).name,
        path=path,
        step=draft.step,
        role=draft.role,
        trained_steps=draft.trained_steps,
        eval_set=eval_set,
        measured_by="engine",
        num_prompts=len(spec_toks),
        **summary_from_counts(total, k, tokens, wall, base_tokens, base_wall),
        per_category=per_cat,
        num_speculative_tokens=k,
        temperature=cfg.evaluate.temperature,
        backend=VLLM,
    )
    if cfg.evaluate.temperature == 0.0:
        ids = [{"id": i, "tokens": t} for i, t in enumerate(spec_toks)]
        refs = [{"id": i, "tokens": t} for i, t in enumerate(ref_toks)]
        # no target logits at hand here: every divergence counts (on_mismatch=warn for
        # nondeterministic kernels)
        row.lossless_match_rate, _ = check_lossless(draft.name, ids, refs, cfg.evaluate.on_mismatch)
    return row


def vllm_rows(cfg: Config, sets: dict[str, list[dict]], drafts: list[DraftEntry], primary=None):
    """Rows for every draft at evaluate.num_speculative_tokens on every eval set (one engine
    per draft and k), the best draft on the `primary` set (default: the first), its k sweep
    there."""
    vllm = import_vllm("evaluate.backend")
    ev = cfg.evaluate
    primary = primary or next(iter(sets))
    target = resolve_model(cfg.target.model, "target.model")
    llm = _make_llm(vllm, cfg, target, None)
    base = {s: _generate_by_category(vllm, llm, ps, cfg, 0) for s, ps in sets.items()}
    _release(llm)

    def measure(d: DraftEntry, k: int, names: list[str]) -> dict[str, LeaderboardRow]:
        path = draft_path(d)
        # the draft's dir, run as its kind asks (draftsmith/kinds/)
        engine = _make_llm(vllm, cfg, target, kind_of(d).vllm_speculative_config(cfg, path, k))
        runs = {s: _generate_by_category(vllm, engine, sets[s], cfg, k) for s in names}
        _release(engine)
        return {s: _row(d, path, runs[s], base[s], cfg, k, s) for s in names}

    k = ev.num_speculative_tokens
    measured = [measure(d, k, list(sets)) for d in drafts]
    rows = [m[s] for s in sets for m in measured]
    best = pick_best(rankable([m[primary] for m in measured]), ev.select_metric)
    best_draft = next(d for d in drafts if d.name == best.checkpoint)
    sweep = [
        sweep_entry(best if kk == k else measure(best_draft, kk, [primary])[primary])
        for kk in ev.k_sweep
    ]
    return rows, best, sweep
