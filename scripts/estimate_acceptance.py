"""Greedy acceptance of drafts from one teacher-forced replay: an evaluation in seconds.

    python scripts/estimate_acceptance.py RUN_DIR [CHECKPOINT_DIR ...] [--k 4]
        [--max-new-tokens 48] [--prompts FILE.jsonl]

Greedy speculative decoding only ever extends the target's own output, so whether a draft
token is accepted is fixed by one question per position: does the draft's argmax, given
the prompt and the target's own prefix, equal the target's token? The script decodes the
prompts once with the target (cached in RUN_DIR/eval/greedy-refs-<prompts>-<n>.json), runs
each draft over prompt + reference and replays the rounds by its kind's replay
(draftsmith.kinds.teacher_forced_results, whose counts equal the engine's:
tests/test_teacher_forced.py, tests/test_pipeline_kinds.py); a CHECKPOINT_DIR may be an
independent draft or an eagle3 head (told apart by its config.json). There are no timings,
so speedup still needs `draftsmith evaluate`. Prompts: the run's held-out prompts, or any jsonl of {"id", "category",
"prompt_ids"} (e.g. an eval set written by generate). Every draft after the first also gets
its acceptance difference from the first, with a 95% paired-bootstrap interval over the
prompts. Without CHECKPOINT_DIRs: every checkpoint of the run and its CE twin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from draftsmith.config import load_config
from draftsmith.distill import list_checkpoints
from draftsmith.evaluate import metrics
from draftsmith.evaluate.prompts import load_prompts, select_prompts
from draftsmith.evaluate.stage import Models
from draftsmith.evaluate.teacher_forced import cached_greedy_refs
from draftsmith.kinds import KINDS, checkpoint_kind, teacher_forced_results
from draftsmith.models import load_target_config


def read_prompts(run: Path, cfg, prompts_file: Path | None) -> tuple[list[dict], str]:
    if prompts_file is None:
        return select_prompts(load_prompts(run), cfg.evaluate.max_prompts), "heldout"
    rows = [json.loads(line) for line in prompts_file.read_text().splitlines() if line.strip()]
    return rows, hashlib.sha256(prompts_file.read_bytes()).hexdigest()[:10]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("checkpoints", nargs="*", type=Path)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=Path, default=None, help="jsonl of prompts with prompt_ids")
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(args.run_dir / "config.yaml")
    prompts, tag = read_prompts(args.run_dir, cfg, args.prompts)
    cache = args.run_dir / "eval" / f"greedy-refs-{tag}-{args.max_new_tokens}.json"
    refs = cached_greedy_refs(cfg.target, prompts, cache, args.max_new_tokens)
    ckpts = args.checkpoints or [
        p
        for kind in KINDS.values()
        for d in (kind.checkpoints_dir(args.run_dir), kind.ce_dir(args.run_dir))
        for _, p in list_checkpoints(d)
    ]
    print(f"{len(refs)} prompts ({tag}) x {args.max_new_tokens} target tokens, greedy, k={args.k}")
    first = None
    vocab = load_target_config(cfg.target).get_text_config().vocab_size
    models = Models(cfg)  # the evaluate stage's loader: the target once, drafts checked
    for path in ckpts:
        draft = {"name": str(path), "ref": str(path), "kind": checkpoint_kind(path).name}
        rows = teacher_forced_results(draft, models, refs, args.k, args.max_new_tokens, vocab)
        s = metrics.summarize(rows, rows, args.k)
        cats = metrics.per_category(rows, rows, [r["category"] for r in rows], args.k)
        line = (
            f"{path}: acceptance {s['acceptance_rate']:.3f}  alpha {s['alpha']:.3f}  "
            f"tokens/target forward {s['mean_accepted_length']:.2f}"
        )
        per_position = "/".join(
            "-" if a is None else f"{a:.2f}" for a in s["per_position_acceptance"]
        )
        line += f"  by position {per_position}"
        if first is None:
            first = rows
        elif c := metrics.paired_acceptance_diff(rows, first, seed=cfg.run.seed):
            lo, hi = c["ci95"]  # paired by prompt against the first draft named
            line += f"  vs first {c['diff']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f})"
        print(line)
        print(
            "    alpha by category: " + ", ".join(f"{k} {v['alpha']:.3f}" for k, v in cats.items())
        )


if __name__ == "__main__":
    main()
