"""Held-out acceptance of every checkpoint of several runs against what each cost: one figure.

    python scripts/budget_curve.py --prompts RUN/data/eval_prompts.jsonl --eval-set mtbench \\
        --refs /path/refs.json --out docs/budget.png RUN_A:label RUN_B:label ...
    ... --x tokens     # the data-scaling view: alpha against teacher tokens trained on
    ... --reuse docs/budget.json   # points already scored (same prompts, refs and k) are read

Every checkpoint of each run (checkpoints/checkpoint-<step>) is scored by teacher-forced
greedy replay (draftsmith.evaluate.teacher_forced: the engine's exact counts) against the
target's own greedy output on the prompts (decoded once, cached in --refs). The x axis:
  cpu     CPU-minutes spent on data + training up to that checkpoint: the training's process
          CPU seconds (draftsmith_checkpoint.json cpu_time_s) plus the data stage's CPU
          seconds (data/meta.json cpu_time_s) prorated by the share of the data trained on so
          far (min(1, tokens_seen / data tokens)): the text a draft has not yet read has not
          yet cost anything. A run whose every step is on-policy (distill.on_policy_fraction
          1) pays no data cost: the draft writes its own text inside training.
  tokens  completion tokens trained on (tokens_seen), log scale.
CPU seconds are process time (both cores count), so the figure does not depend on how
loaded the machine was. Writes the PNG and a JSON table beside it; prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from draftsmith.config import load_config
from draftsmith.distill import list_checkpoints
from draftsmith.distill.teacher import is_on_policy_step
from draftsmith.evaluate import metrics
from draftsmith.evaluate.teacher_forced import cached_greedy_refs, teacher_forced_results
from draftsmith.io import atomic_write_json
from draftsmith.models import (
    load_model,
    load_target_config,
)


def read_prompts(path: Path, eval_set: str | None) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if eval_set:
        rows = [r for r in rows if r.get("eval_set", r.get("source")) == eval_set]
    if not rows:
        raise SystemExit(f"{path}: no prompts (eval set {eval_set!r})")
    return rows


def offline_share(cfg, steps: int) -> float:
    """The share of the first `steps` steps that trained on stored text: on-policy steps
    (the draft writes, distill.on_policy_fraction) read none of the data stage's text."""
    if steps == 0:
        return 1.0
    fraction = cfg.distill.on_policy_fraction
    on = sum(is_on_policy_step(cfg.run.seed, s, fraction) for s in range(steps))
    return 1.0 - on / steps


def run_points(
    run: Path, label: str, refs: list[dict], k: int, max_new: int, vocab: int, known: dict
):
    """One point per checkpoint; `known` holds points scored before, by (run, step, the
    checkpoint's recorded CPU seconds): a checkpoint trained further is scored again."""
    cfg = load_config(run / "config.yaml")
    meta = json.loads((run / "data" / "meta.json").read_text())
    data_cpu = float(meta.get("cpu_time_s", 0.0))
    data_tokens = meta["num_completion_tokens"]
    points = []
    for step, path in list_checkpoints(run / "checkpoints"):
        ck = json.loads((path / "draftsmith_checkpoint.json").read_text())
        seen = int(ck.get("tokens_seen", 0))
        old = known.get((str(run), step, float(ck.get("cpu_time_s", 0.0))))
        if old is not None:
            points.append({**old, "label": label})
            print(f"{label:24s} step {step:5d}  alpha {old['alpha']:.3f}  (reused)", flush=True)
            continue
        draft = load_model(str(path), device=torch.device("cpu"), dtype=torch.float32)
        rows = teacher_forced_results(draft, refs, k, max_new, vocab)
        s = metrics.summarize(rows, rows, k)
        cats = metrics.per_category(rows, rows, [r["category"] for r in rows], k)
        stored = seen * offline_share(cfg, step)
        data_share = min(1.0, stored / data_tokens) if data_tokens else 0.0
        points.append(
            {
                "run": str(run),
                "label": label,
                "step": step,
                "tokens_seen": seen,
                "train_cpu_s": float(ck.get("cpu_time_s", 0.0)),
                "data_cpu_s": data_cpu * data_share,
                "cpu_minutes": (float(ck.get("cpu_time_s", 0.0)) + data_cpu * data_share) / 60,
                "alpha": s["alpha"],
                "acceptance_rate": s["acceptance_rate"],
                "mean_accepted_length": s["mean_accepted_length"],
                "alpha_by_category": {c: v["alpha"] for c, v in cats.items()},
            }
        )
        print(
            f"{label:24s} step {step:5d}  tokens {seen:8d}  cpu-min {points[-1]['cpu_minutes']:6.1f}"
            f"  alpha {s['alpha']:.3f}  tok/fwd {s['mean_accepted_length']:.2f}",
            flush=True,
        )
    return points


def fit_points(points: list[dict], span: float = 32.0) -> list[dict]:
    """The points within `span` x of the most tokens: the early, warm-up ones bend the line."""
    top = max((p["tokens_seen"] for p in points), default=0)
    return [p for p in points if p["tokens_seen"] > 0 and p["tokens_seen"] >= top / span]


def log_fit(points: list[dict]) -> tuple[float, float] | None:
    """alpha = a + b * log2(tokens) by least squares over `fit_points`; None with under 3."""
    pts = fit_points(points)
    if len(pts) < 3:
        return None
    xs = [math.log2(p["tokens_seen"]) for p in pts]
    ys = [p["alpha"] for p in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def report_fits(points: list[dict], goals=(0.5, 0.6)) -> None:
    """Per label: alpha gained per doubling of teacher tokens, and the tokens at which the
    fitted line would reach each goal (a floor: such curves bend down, rarely up)."""
    for label in dict.fromkeys(p["label"] for p in points):
        fit = log_fit([p for p in points if p["label"] == label])
        if fit is None or fit[1] <= 0:
            continue
        a, b = fit
        reach = ", ".join(f"alpha {g} at {2 ** ((g - a) / b):.3g} tokens" for g in goals)
        print(f"{label}: +{b:.3f} alpha per doubling of teacher tokens; the line reaches {reach}")


def plot(points: list[dict], x: str, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label in dict.fromkeys(p["label"] for p in points):
        pts = sorted((p for p in points if p["label"] == label), key=lambda p: p["step"])
        key = "cpu_minutes" if x == "cpu" else "tokens_seen"
        pts = [p for p in pts if x == "cpu" or p["tokens_seen"] > 0]
        line = ax.plot([p[key] for p in pts], [p["alpha"] for p in pts], "o-", label=label)
        fit = log_fit(pts) if x == "tokens" else None
        if fit is not None:
            used = [p["tokens_seen"] for p in fit_points(pts)]
            xs = [min(used), max(used)]
            ys = [fit[0] + fit[1] * math.log2(v) for v in xs]
            ax.plot(xs, ys, "--", color=line[0].get_color(), alpha=0.5, linewidth=1)
    if x == "tokens":
        ax.set_xscale("log")
        ax.set_xlabel("teacher tokens trained on")
    else:
        ax.set_xlabel("CPU-minutes on data + training (process time, 2 cores)")
    ax.set_ylabel("alpha (accepted / judged), k=4 greedy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="RUN_DIR[:label]")
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--eval-set", default=None)
    ap.add_argument("--refs", type=Path, required=True, help="cache of the target's outputs")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--x", choices=("cpu", "tokens"), default="cpu")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="held-out MT-bench acceptance against cost")
    ap.add_argument(
        "--reuse", type=Path, nargs="*", default=[], help="JSON tables this script wrote before"
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    first = Path(args.runs[0].split(":")[0])
    cfg = load_config(first / "config.yaml")
    prompts = read_prompts(args.prompts, args.eval_set)
    refs = cached_greedy_refs(cfg.target, prompts, args.refs, args.max_new_tokens)
    vocab = load_target_config(cfg.target).get_text_config().vocab_size
    known = {
        (p["run"], p["step"], p["train_cpu_s"]): p
        for path in args.reuse
        for p in json.loads(path.read_text())
    }
    points = []
    for spec in args.runs:
        run, _, label = spec.partition(":")
        points += run_points(
            Path(run), label or Path(run).name, refs, args.k, args.max_new_tokens, vocab, known
        )
    plot(points, args.x, args.out, args.title)
    if args.x == "tokens":
        report_fits(points)
    atomic_write_json(args.out.with_suffix(".json"), points)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
