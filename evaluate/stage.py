"""`draftsmith evaluate CONFIG`: every checkpoint ranked exactly, the best ones decoded for real.

Flow, for every named eval set of data/eval_prompts.jsonl (each capped by evaluate.max_prompts;
with evaluate.turn2 also `<set>-turn2`, evaluate/second_turn.py):
  1. the target-only baseline: every prompt decoded by the engine without a draft (its
     timings, and at temperature 0 the target's own greedy output);
  2. every draft on every prompt at k = evaluate.num_speculative_tokens: greedy, one
     teacher-forced pass over the target's output replayed into the engine's exact counts
     (each draft kind's own replay, DraftKind.replay: one pass for a causal-LM draft,
     one per k for a head reading its own states; evaluate/teacher_forced.py);
     sampled, the engine itself;
  3. greedy: the real engine on the best draft of each kind and the drafts in
     `comparisons`, on at most evaluate.engine_max_prompts prompts per set: wall clock,
     cost ratios, the losslessness check, and a check that its counts equal the replay's;
  4. the best draft by evaluate.select_metric on evaluate.primary_eval_set, its k sweep on
     that set and its draft/verify costs timed robustly (evaluate/timing.py) -> the
     recommended k (ranking.recommend_k), and one per category from that category's own
     acceptance at the same costs (ranking.recommend_k_by_category);
  5. leaderboard.{json,csv}, plots, a printed table and a W&B log (evaluate/report.py).

Every row carries `eval_set` and `measured_by`: "teacher_forced" (exact counts over every
prompt of the set, no timings) or "engine" (real decoding of its `num_prompts` prompts).

The work is split: evaluate/native.py runs and caches the engine, the replays and the
timings (its docstring lists the cache files), evaluate/board.py builds the rows and the
comparisons.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import report, second_turn
from draftsmith.evaluate.board import check_self_draft, native_board
from draftsmith.evaluate.native import (
    Models,
    NativeEvaluator,
    prompts_key,
    safe_name,
    settings_key,
)
from draftsmith.evaluate.prompts import (
    check_drafts,
    eval_sets,
    list_drafts,
    load_prompts,
    primary_set,
)
from draftsmith.evaluate.ranking import recommend_k, recommend_k_by_category
from draftsmith.io import atomic_write_json, clean_stale_temps, load_cached
from draftsmith.models import hardware, load_target_config, model_key, resolve_model
from draftsmith.rundir import record_config

# ----------------------------------------------------------------------------- eval sets


def _turn2_sets(cfg: Config, sets: dict, models: Models, results_dir: Path) -> dict:
    """`<set>-turn2` for every set with followups (evaluate.turn2); answers cached."""
    out = {}
    for name, prompts in sets.items():
        asked = second_turn.asked_again(prompts)
        if not asked:
            continue
        settings = {
            "target": model_key(resolve_model(cfg.target.model, "target.model")),
            "revision": cfg.target.revision,
            "dtype": cfg.target.dtype,
            "device": cfg.run.device,
            "prompts": prompts_key(asked),
            "answer_tokens": cfg.evaluate.turn2_answer_tokens,
        }
        path = results_dir / f"turn1-answers-{safe_name(name)}-{settings_key(settings)}.json"
        data = load_cached(path, settings)
        if data is None:
            ids = second_turn.target_answers(models.target(), models.tokenizer(), cfg, asked)
            texts = [models.tokenizer().decode(t, skip_special_tokens=True).strip() for t in ids]
            data = {"settings": settings, "answers": texts}
            atomic_write_json(path, data)
        ctx = getattr(load_target_config(cfg.target), "max_position_embeddings", None)
        limit = ctx - cfg.evaluate.max_new_tokens if ctx else None
        prompts2, too_long = second_turn.turn2_prompts(
            asked, data["answers"], cfg, models.tokenizer(), limit
        )
        if too_long:
            print(
                f"[evaluate] {name}{second_turn.SUFFIX}: {too_long} prompts over {limit} tokens left out"
            )
        if prompts2:
            out[name + second_turn.SUFFIX] = prompts2
    return out


def choose_primary(cfg: Config, sets: dict) -> str:
    """The primary set's name, checked before any work (turn-2 sets count by name)."""
    names = list(sets)
    if cfg.evaluate.turn2:
        names += [s + second_turn.SUFFIX for s, ps in sets.items() if second_turn.asked_again(ps)]
    return primary_set(dict.fromkeys(names), cfg.evaluate.primary_eval_set)


def with_turn2(cfg: Config, sets: dict, primary: str, models: Models, results_dir: Path):
    """The sets, the primary first, with `<set>-turn2` added under evaluate.turn2."""
    if cfg.evaluate.turn2:
        sets = sets | _turn2_sets(cfg, sets, models, results_dir)
    if primary not in sets:
        raise DraftsmithError(
            f"evaluate.primary_eval_set: every prompt of {primary!r} is too long for the target"
        )
    return {primary: sets[primary], **sets}


def run_evaluate(cfg: Config) -> None:
    ev = cfg.evaluate
    eval_dir = cfg.output_dir / "eval"
    results_dir = eval_dir / "results"
    clean_stale_temps(eval_dir)
    clean_stale_temps(results_dir)
    sets = eval_sets(load_prompts(cfg.output_dir), ev.max_prompts)
    primary = choose_primary(cfg, sets)
    drafts = list_drafts(
        cfg.output_dir, cfg.draft.kinds, ev.baselines, cfg.distill.ce_baseline, cfg.target.model
    )
    check_drafts(cfg, drafts)  # files whole, tokenizers the target's: before any decoding
    record_config(cfg)
    models = Models(cfg)
    sets = with_turn2(cfg, sets, primary, models, results_dir)
    if ev.backend == "vllm":
        from draftsmith.evaluate.vllm_backend import vllm_rows

        rows, best, sweep = vllm_rows(cfg, sets, drafts, primary)
        out = {"rows": rows, "best": best, "k_sweep": sweep, "costs": None, "comparisons": []}
    else:
        out = native_board(cfg, sets, primary, drafts, NativeEvaluator(cfg, results_dir, models))
    sweep = out["k_sweep"]
    rec = recommend_k(sweep) if sweep else {"k": ev.num_speculative_tokens, "by": None}
    engine_n = ev.engine_max_prompts if ev.backend == "native" and ev.temperature == 0 else None
    board = {
        "select_metric": ev.select_metric,
        "primary_eval_set": primary,
        "eval_sets": {
            s: {
                "num_prompts": len(ps),
                "engine_prompts": min(engine_n or len(ps), len(ps)),
                "categories": sorted({p["category"] for p in ps}),
            }
            for s, ps in sets.items()
        },
        "best": out["best"].checkpoint,
        "best_path": out["best"].path,
        "recommended_k": rec["k"],
        "k_recommendation": rec,
        # the same rule on each category's own acceptance (primary set, fixed k)
        "k_by_category": recommend_k_by_category(sweep),
        "k_sweep": sweep,
        "costs": out["costs"],
        "kernels": out.get("kernels"),  # the linear layers' form per width the engine used, and why
        # drafts decoded with rounded weights (as_loaded | int8 | int4)
        "draft_weights": ev.draft_weights if ev.backend == "native" else "as_loaded",
        # per draft loaded by this run: its rounded layers and the input widths timed faster
        # through the quantized kernel
        "quant_widths": out.get("quant_widths"),
        "hardware": hardware(),
        "target": cfg.target.model,
        "backend": ev.backend,
        "rows": out["rows"],
        "comparisons": out["comparisons"],
    }
    report.write_reports(cfg, board, eval_dir)
    check_self_draft(board["rows"], ev.on_mismatch, exact=models.dtype == torch.float32)
