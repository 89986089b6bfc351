"""Leaderboard rows, the paired comparisons and the native board of an evaluation.

`build_row` turns per-prompt results into one row; `native_board` drives a NativeEvaluator
(evaluate/native.py) over every draft and eval set and returns the rows, the best draft, its
k sweep and the comparisons that evaluate/stage.py writes out.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from draftsmith.clock import quartiles
from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import metrics
from draftsmith.evaluate.ranking import draft_path, pick_best, rankable
from draftsmith.evaluate.records import DraftEntry, LeaderboardRow, MetricSummary, summary_args
from draftsmith.kinds import kind_of

# ----------------------------------------------------------------------------- rows and ranking


def build_row(
    draft: DraftEntry,
    results: list[dict],
    base: list[dict],
    cfg: Config,
    k: int,
    eval_set: str,
    measured_by: str,
    data: dict | None = None,
    prompts: list[dict] | None = None,
) -> LeaderboardRow:
    """One leaderboard row: `draft` at k on `eval_set`, from per-prompt results (`data`: the
    engine's cache entry, for the lossless check; `prompts`, aligned with the results: their
    ids, for the echo split)."""
    engine = measured_by == "engine"
    speedups = metrics.per_prompt_speedups(results, base) if engine else []
    q = quartiles(speedups) if speedups else None
    ids = [p["prompt_ids"] for p in prompts] if prompts is not None else None
    categories = [r["category"] for r in results]
    per_category = metrics.per_category(results, base, categories, k, ids)
    ties = (data or {}).get("lossless_ties")
    return LeaderboardRow(
        checkpoint=draft.name,
        path=draft_path(draft),
        step=draft.step,
        role=draft.role,
        kind=kind_of(draft).name,
        trained_steps=draft.trained_steps,
        eval_set=eval_set,
        measured_by=measured_by,
        **summary_args(metrics.summarize(results, base, k, ids)),
        speedup_iqr=[q[0], q[2]] if q else None,
        per_category={c: MetricSummary(**summary_args(s)) for c, s in per_category.items()},
        lossless_match_rate=(data or {}).get("lossless_match_rate"),
        # prompts whose output left the target's at a numerical near-tie (check_lossless)
        lossless_ties=len(ties) if ties is not None else None,
        num_speculative_tokens=k,
        temperature=cfg.evaluate.temperature,
        backend=cfg.evaluate.backend,
    )


def compared(drafts: list[DraftEntry]) -> list[tuple[DraftEntry, list[DraftEntry]]]:
    """Per kind: its last distilled checkpoint and the drafts it is compared with (its own
    CE twin and init; a kind is never compared with another kind's drafts)."""
    out = []
    for kind in dict.fromkeys(kind_of(d).name for d in drafts):
        mine = [d for d in drafts if kind_of(d).name == kind]
        distilled = [d for d in mine if d.role == "distilled"]
        if distilled:
            out.append((distilled[-1], [d for d in mine if d.role in ("ce_twin", "init")]))
    return out


def compare_drafts(
    drafts: list[DraftEntry], per_prompt: dict[str, list[dict]], seed: int
) -> list[dict]:
    """Each kind's last distilled checkpoint against its CE twin and untrained init, paired by
    prompt.

    These are the two claims a run's report makes (the loss beats plain cross-entropy, the
    training beats doing nothing); the paired bootstrap interval says whether the prompts
    measured can tell the drafts apart. Greedy per-prompt counts come from the replay: exact.
    """
    out = []
    for last, others in compared(drafts):
        for other in others:
            diff = metrics.paired_diff_by_category(
                per_prompt[last.name], per_prompt[other.name], seed=seed
            )
            if diff is not None:
                out.append({"draft": last.name, "against": other.name, "role": other.role, **diff})
    return out


def compare_kinds(
    rows: list[LeaderboardRow], per_prompt: dict[str, list[dict]], metric: str, seed: int
):
    """With drafts of more than one kind: the best of each kind (by `metric` on these rows)
    against the best of every other kind, paired by prompt: which kind pays on this set."""
    ranked = rankable(rows)
    kinds = list(dict.fromkeys(r.kind for r in ranked))
    best = [pick_best([r for r in ranked if r.kind == k], metric) for k in kinds]
    out = []
    for i, a in enumerate(best):
        for b in best[i + 1 :]:
            diff = metrics.paired_diff_by_category(
                per_prompt[a.checkpoint], per_prompt[b.checkpoint], seed=seed
            )
            if diff is not None:
                row = {"draft": a.checkpoint, "against": b.checkpoint, "role": "other_kind"}
                out.append({**row, **diff})
    return out


def engine_drafts(
    drafts: list[DraftEntry], rows: list[LeaderboardRow], metric: str
) -> list[DraftEntry]:
    """The drafts the engine decodes when greedy: the best of each kind by `metric` (on the
    primary set's rows, aligned with `drafts`) and the drafts of the comparisons."""
    names = {d.name for d in drafts if d.role == "sanity"}
    ranked = rankable(rows)
    for kind in dict.fromkeys(r.kind for r in ranked):
        names.add(pick_best([r for r in ranked if r.kind == kind], metric).checkpoint)
    for last, others in compared(drafts):
        names |= {d.name for d in [last, *others]}
    return [d for d in drafts if d.name in names]


def check_self_draft(
    rows: list[LeaderboardRow], on_mismatch: str, exact: bool = True
) -> list[dict]:
    """The target drafting for itself (evaluate.baselines: [target]) must accept every token
    it is judged on, by replay and by the engine: anything less means the engine, a loader
    or the config is wrong. Greedy rows only (sampled acceptance is min(1, p/q) of two
    passes' floats). One line per row; a failure is an error unless on_mismatch is warn.
    `exact` False (a bf16/fp16 target): a 1-token draft step and a (k+1)-token verify pass
    round real near-ties differently, so a shortfall is reported as a warning, not an error."""
    checked = []
    for r in rows:
        if r.role != "sanity" or r.temperature != 0:
            continue
        ok = r.alpha == 1.0
        checked.append({"eval_set": r.eval_set, "measured_by": r.measured_by, "pass": ok})
        print(
            f"[evaluate] sanity: the target drafting for itself on {r.eval_set} "
            f"({r.measured_by}): alpha {r.alpha:.4f}, "
            f"{r.mean_accepted_length:.2f} tokens per target forward "
            f"(k={r.num_speculative_tokens}): {'pass' if ok else 'FAIL'}"
        )
    failed = [c for c in checked if not c["pass"]]
    if failed and not exact:
        print(
            "[evaluate] WARNING the target rejected some of its own tokens in reduced precision: "
            "near-ties round differently in the draft step and the verify pass; run the check "
            "with target.dtype=float32 to make it exact"
        )
        return checked
    if failed and on_mismatch == "error":
        where = ", ".join(f"{c['eval_set']} ({c['measured_by']})" for c in failed)
        raise DraftsmithError(
            f"evaluate.baselines[target]: the target drafting for itself rejected tokens on "
            f"{where}; its acceptance must be 1: check the target's loading and dtype "
            "(evaluate.on_mismatch=warn to keep going)"
        )
    return checked


def native_board(cfg: Config, sets: dict, primary: str, drafts: list[DraftEntry], runner) -> dict:
    ev, k = cfg.evaluate, cfg.evaluate.num_speculative_tokens
    greedy = runner.sampling.greedy
    how = "teacher-forced replay, engine on the best" if greedy else "engine (sampled)"
    print(
        f"[evaluate] {len(drafts)} drafts on {len(sets)} eval sets "
        f"({', '.join(f'{s}: {len(ps)}' for s, ps in sets.items())} prompts), k={k}: {how}"
    )
    bases = {s: runner.baseline(s, ps) for s, ps in sets.items()}
    by = "teacher_forced" if greedy else "engine"
    ranked, ranking_rows = {}, {}
    for d in tqdm(drafts, desc="drafts", dynamic_ncols=True):
        for s, ps in sets.items():
            if greedy:
                ranked[d.name, s] = runner.replayed(d, s, ps, bases[s], k)
                data = None
            else:
                data = runner.engine(d, s, ps, bases[s], k)
                ranked[d.name, s] = data["results"]
            timed = bases[s] if data is None else runner.timing_base(bases[s], data)
            row = build_row(d, ranked[d.name, s], timed, cfg, k, s, by, data, ps)
            ranking_rows[d.name, s] = row
    engine_rows = {}
    by_speed = ev.select_metric == "speedup"
    if greedy:
        primary_rows = [ranking_rows[d.name, primary] for d in drafts]
        # speedup needs the engine: the candidates are then the best by tokens per forward
        chosen = engine_drafts(
            drafts, primary_rows, "mean_accepted_length" if by_speed else ev.select_metric
        )
        for d in tqdm(chosen, desc="engine", dynamic_ncols=True):
            for s, ps in sets.items():
                engine_rows[d.name, s] = runner.engine_row(d, s, ps, bases[s], k)
    pool = (
        [r for (_, s), r in engine_rows.items() if s == primary]
        if greedy and by_speed
        else [ranking_rows[d.name, primary] for d in drafts]
    )
    best = pick_best(rankable(pool), ev.select_metric)
    best_draft = next(d for d in drafts if d.name == best.checkpoint)
    sweep, costs = runner.sweep(best_draft, primary, sets[primary], bases[primary])
    rows = [
        r
        for s in sets
        for d in drafts
        for r in (ranking_rows[d.name, s], engine_rows.get((d.name, s)))
        if r is not None
    ]
    replay_metric = "mean_accepted_length" if by_speed else ev.select_metric  # replay rows
    comparisons = []
    for s in sets:
        per_prompt = {d.name: ranked[d.name, s] for d in drafts}
        set_rows = [ranking_rows[d.name, s] for d in drafts]
        comparisons += [
            {**c, "eval_set": s}
            for c in compare_drafts(drafts, per_prompt, cfg.run.seed)
            + compare_kinds(set_rows, per_prompt, replay_metric, cfg.run.seed)
        ]
    return {
        "rows": rows,
        "best": best,
        "k_sweep": sweep,
        "costs": costs,
        "comparisons": comparisons,
        "kernels": runner.kernels,
        "quant_widths": runner.quant or None,
    }
