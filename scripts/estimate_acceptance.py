"""Greedy acceptance of drafts from one teacher-forced replay: an evaluation in seconds.

    python scripts/estimate_acceptance.py RUN_DIR [CHECKPOINT_DIR ...] [--k 4]
        [--max-new-tokens 64] [--set mtbench ...] [--prompts FILE.jsonl] [--draft-weights int8 int4]

Greedy speculative decoding only ever extends the target's own output, so whether a draft
token is accepted is fixed by one question per position: does the draft's argmax, given
the prompt and the target's own prefix, equal the target's token? The script takes the
target's greedy output from the evaluate stage's target-only baseline (its cache in
RUN_DIR/eval/results when the stage has run, else decoded and cached there the same way),
runs each draft over prompt + output and replays the rounds by its kind's replay
(draftsmith.kinds.teacher_forced_results, whose counts equal the engine's:
tests/test_teacher_forced.py, tests/test_pipeline_kinds.py); a CHECKPOINT_DIR may be an
independent draft or an eagle3 head (told apart by its config.json). There are no timings,
so speedup still needs `draftsmith evaluate`. Prompts: each of the run's eval sets, or any
jsonl of {"id", "category", "prompt_ids"}. Every draft after the first also gets its alpha
difference from the first, overall and per category, with 95% paired-bootstrap intervals
over the prompts, and where its misses fall: the share of them at positions where the
target itself gives its own token less than metrics.TARGET_SURE (the target's probabilities
from one teacher-forced pass per prompt, cached beside its outputs). A CHECKPOINT_DIR may
be a bare checkpoint name of the run. Without CHECKPOINT_DIRs: every checkpoint of the run
and its CE twin.
--draft-weights int8 int4 replays each draft again with its weights rounded to each
(evaluate.draft_weights) and pairs that against the same draft as loaded: what the rounding
costs in acceptance. (The replay's inputs are wide, so the rounded weights run as floats;
the engine's quantized kernels multiply by the same rounded weights.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from draftsmith.config import load_config
from draftsmith.distill import list_checkpoints
from draftsmith.evaluate import metrics
from draftsmith.evaluate.native import Models, NativeEvaluator
from draftsmith.evaluate.prompts import eval_sets, load_prompts
from draftsmith.evaluate.records import DraftEntry
from draftsmith.kinds import KINDS, checkpoint_kind, teacher_forced_results
from draftsmith.models import load_target_config
from draftsmith.quant_draft import LAYERS, quantize_draft


def read_sets(run: Path, cfg, prompts_file: Path | None, names: list[str]) -> dict[str, list]:
    """{eval set: prompts}: the run's held-out sets (evaluate.max_prompts applied, as the
    evaluate stage does), or one set read from --prompts."""
    if prompts_file is not None:
        rows = [json.loads(line) for line in prompts_file.read_text().splitlines() if line]
        return {prompts_file.stem: rows}
    sets = eval_sets(load_prompts(run), cfg.evaluate.max_prompts)
    unknown = [n for n in names if n not in sets]
    if unknown:
        raise SystemExit(f"--set {unknown[0]}: not an eval set of {run} (has {', '.join(sets)})")
    return {n: ps for n, ps in sets.items() if not names or n in names}


def checkpoints_of(run: Path) -> list[Path]:
    return [
        p
        for kind in KINDS.values()
        for d in (kind.checkpoints_dir(run), kind.ce_dir(run))
        for _, p in list_checkpoints(d)
    ]


def resolve_checkpoints(run: Path, named: list[Path]) -> list[Path]:
    """The CHECKPOINT_DIRs as given, a bare name (checkpoint-10) read as one of the run's
    own checkpoint dirs; checked before the target's baseline is decoded (minutes)."""
    out = []
    for path in named:
        if not path.exists() and len(path.parts) == 1:
            found = [
                d / path
                for kind in KINDS.values()
                for d in (kind.checkpoints_dir(run), kind.ce_dir(run))
                if (d / path).is_dir()
            ]
            path = found[0] if found else path
        if not (path / "config.json").is_file():
            raise SystemExit(f"{path}: not a checkpoint dir (no config.json)")
        out.append(path)
    return out


def report(
    path,
    rows: list[dict],
    prompts: list[dict],
    base: list[dict],
    k: int,
    first,
    seed: int,
    against="first",
) -> None:
    """Two or three lines per draft: its pooled figures (and the difference from `first`, the
    rows of the draft named by `against`), then alpha per category, then where it misses
    (`base`: the target's own rows, with its probabilities of its tokens when greedy)."""
    ids = [p["prompt_ids"] for p in prompts]
    s = metrics.summarize(rows, rows, k, ids)
    cats = metrics.per_category(rows, rows, [r["category"] for r in rows], k, ids)
    line = (
        f"{path}: acceptance {s['acceptance_rate']:.3f}  alpha {s['alpha']:.3f}  "
        f"tokens/target forward {s['mean_accepted_length']:.2f}"
    )
    per_position = "/".join("-" if a is None else f"{a:.2f}" for a in s["per_position_acceptance"])
    line += f"  by position {per_position}"
    if s.get("echo_share") is not None:
        line += f"  echo {s['echo_share']:.2f} (alpha new {s['alpha_new']:.3f})"
    if first is not None and (c := metrics.paired_diff_by_category(rows, first, seed=seed)):
        lo, hi = c["alpha_ci95"]  # paired by prompt against the first draft named
        line += f"  alpha vs {against} {c['alpha_diff']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f})"
    print(line)
    print("    alpha by category: " + ", ".join(f"{k} {v['alpha']:.3f}" for k, v in cats.items()))
    if first is not None and c and c.get("per_category"):
        diffs = (
            f"{cat} {d['alpha_diff']:+.3f} ({d['alpha_ci95'][0]:+.3f}..{d['alpha_ci95'][1]:+.3f})"
            for cat, d in c["per_category"].items()
            if d and d["alpha_ci95"]
        )
        print(f"    vs {against} by category: " + ", ".join(diffs))
    if conf := metrics.confidence_split(rows, base):
        print(
            f"    misses where the target is unsure (p(own token) < {metrics.TARGET_SURE:g}): "
            f"{fmt(conf['misses_target_unsure'], '.0%')}; alpha where it is sure "
            f"{fmt(conf['alpha_target_sure'], '.3f')} ({fmt(conf['target_sure_share'], '.0%')} "
            f"of judged), elsewhere {fmt(conf['alpha_target_unsure'], '.3f')}"
        )


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("checkpoints", nargs="*", type=Path)
    ap.add_argument("--k", type=int, default=None, help="default evaluate.num_speculative_tokens")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default evaluate's")
    ap.add_argument("--set", action="append", default=[], help="eval set(s); default all")
    ap.add_argument("--prompts", type=Path, default=None, help="jsonl of prompts with prompt_ids")
    ap.add_argument(
        "--draft-weights",
        nargs="*",
        default=[],
        choices=list(LAYERS),
        help="also replay each draft with its weights rounded to each, paired against itself "
        "as loaded",
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(args.run_dir / "config.yaml")
    cfg.run.output_dir = str(args.run_dir)
    if args.max_new_tokens is not None:
        cfg.evaluate.max_new_tokens = args.max_new_tokens
    k, budget = args.k or cfg.evaluate.num_speculative_tokens, cfg.evaluate.max_new_tokens
    sets = read_sets(args.run_dir, cfg, args.prompts, args.set)
    ckpts = resolve_checkpoints(args.run_dir, args.checkpoints) or checkpoints_of(args.run_dir)
    vocab = load_target_config(cfg.target).get_text_config().vocab_size
    models = Models(cfg)  # the evaluate stage's loader: the target once, drafts checked
    # the evaluate stage's target-only baseline, from its cache when it has run: the same
    # greedy tokens, dtype and kernels the leaderboard's replay rows are counted on
    evaluator = NativeEvaluator(cfg, args.run_dir / "eval" / "results", models)
    for name, prompts in sets.items():
        base = evaluator.baseline(name, prompts)
        refs = [{**p, "tokens": b["tokens"]} for p, b in zip(prompts, base)]
        print(f"== {name}: {len(refs)} prompts x {budget} target tokens, greedy, k={k}")
        first = None
        for path in ckpts:
            draft = DraftEntry(name=str(path), ref=str(path), kind=checkpoint_kind(path).name)
            rows = teacher_forced_results(draft, models, refs, k, budget, vocab)
            report(path, rows, prompts, base, k, first, cfg.run.seed)
            first = first or rows
            for weights in args.draft_weights:
                rounded = teacher_forced_results(
                    draft,
                    models,
                    refs,
                    k,
                    budget,
                    vocab,
                    lambda m, w=weights: quantize_draft(m, w, models.target()),
                )
                report(
                    f"{path} [{weights}]",
                    rounded,
                    prompts,
                    base,
                    k,
                    rows,
                    cfg.run.seed,
                    "as loaded",
                )


if __name__ == "__main__":
    main()
