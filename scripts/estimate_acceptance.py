"""Greedy acceptance of drafts from one teacher-forced pass: an evaluation in seconds.

    python scripts/estimate_acceptance.py RUN_DIR [CHECKPOINT_DIR ...] [--k 4] [--max-new-tokens 48]

Greedy speculative decoding only ever extends the target's own output, so whether a draft
token is accepted is fixed by one question per position: does the draft's argmax, given
the prompt and the target's own prefix, equal the target's token? The script decodes the
run's held-out prompts once with the target (cached in RUN_DIR/eval/greedy-refs-<n>.json),
runs each draft once over prompt + reference, and replays the rounds with
evaluate.metrics.greedy_rounds. The counts equal the engine's (tests/test_specdec.py), up
to fp32 near-ties between a batched pass and cached decoding; there are no timings, so
speedup still needs `draftsmith evaluate`. Used to compare configs for the default (README).
Every draft after the first also gets its acceptance difference from the first, with a 95%
paired-bootstrap interval over the prompts. Without CHECKPOINT_DIRs: every checkpoint of
the run and its CE twin.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from draftsmith.config import load_config
from draftsmith.distill import list_checkpoints
from draftsmith.evaluate import metrics
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.evaluate.prompts import load_prompts, select_prompts
from draftsmith.io import atomic_write_json
from draftsmith.models import eos_token_ids, load_model, load_target, load_target_tokenizer


def target_refs(run: Path, cfg, max_new: int) -> list[dict]:
    """The target's greedy output for each eval prompt (computed once, then cached)."""
    path = run / "eval" / f"greedy-refs-{max_new}.json"
    if path.is_file():
        return json.loads(path.read_text())
    prompts = select_prompts(load_prompts(run), cfg.evaluate.max_prompts)
    target = load_target(cfg.target, torch.device("cpu"), torch.float32)
    tok = load_target_tokenizer(cfg.target)
    decoder = SpeculativeDecoder(target, eos_ids=eos_token_ids(tok, target.generation_config))
    refs = [{**p, "tokens": decoder.generate(p["prompt_ids"], max_new).tokens} for p in prompts]
    atomic_write_json(path, refs)
    return refs


@torch.inference_mode()
def agreement(draft, refs: list[dict]) -> list[list[bool]]:
    """Per prompt, per target token: does the draft's teacher-forced argmax match it?"""
    out = []
    for r in refs:
        ids = torch.tensor([r["prompt_ids"] + r["tokens"][:-1]])
        logits = draft(input_ids=ids, logits_to_keep=len(r["tokens"])).logits[0]  # (n, V)
        out.append((logits.argmax(-1) == torch.tensor(r["tokens"])).tolist())
    return out


def summary(agree: list[list[bool]], k: int) -> dict:
    rounds = [metrics.greedy_rounds(a, k) for a in agree]  # per prompt
    tot = {key: sum(r[key] for r in rounds) for key in ("proposed", "accepted", "rounds")}
    acc_at = [sum(r["accepted_at"][i] for r in rounds) for i in range(k)]
    reach_at = [sum(r["reached_at"][i] for r in rounds) for i in range(k)]
    return {
        "acceptance_rate": metrics.acceptance_rate(tot["accepted"], tot["proposed"]),
        "alpha": metrics.alpha(acc_at, reach_at),
        "mean_accepted_length": sum(map(len, agree)) / tot["rounds"],
        "rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("checkpoints", nargs="*", type=Path)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(args.run_dir / "config.yaml")
    refs = target_refs(args.run_dir, cfg, args.max_new_tokens)
    ckpts = args.checkpoints or [
        p
        for d in (args.run_dir / "checkpoints", args.run_dir / "ablations" / "ce")
        for _, p in list_checkpoints(d)
    ]
    print(f"{len(refs)} held-out prompts x {args.max_new_tokens} target tokens, greedy, k={args.k}")
    first = None
    for path in ckpts:
        draft = load_model(str(path), device=torch.device("cpu"), dtype=torch.float32)
        s = summary(agreement(draft, refs), args.k)
        line = (
            f"{path}: acceptance {s['acceptance_rate']:.3f}  alpha {s['alpha']:.3f}  "
            f"tokens/target forward {s['mean_accepted_length']:.2f}"
        )
        if first is None:
            first = s
        elif c := metrics.paired_acceptance_diff(s["rounds"], first["rounds"], seed=cfg.run.seed):
            lo, hi = c["ci95"]  # paired by prompt against the first draft named
            line += f"  vs first {c['diff']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f})"
        print(line)


if __name__ == "__main__":
    main()
