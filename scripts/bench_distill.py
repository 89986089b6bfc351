"""Distillation throughput: draftsmith's trainer vs TRL's GKDTrainer, side by side, one run.

    flock /tmp/draftsmith-bench.lock /work/venv/bin/python scripts/bench_distill.py

Same teacher (SmolLM2-135M-Instruct), same student (from_target, its first 2 layers),
same data, batch size, sequence lengths, learning rate and loss (forward KL:
TRL beta=0, lmbda=0). draftsmith runs its offline teacher (top-k log-probs stored at
generation time, here computed once before timing, as generate would) with length
bucketing and the LM head only on completion positions; TRL runs the teacher online
over full padded batches. Prints completion tokens/s for both and the ratio, and
checks both losses agree on the first batch (draftsmith's online forward KL vs
TRL's generalized JSD at beta=0; the offline top-k value is printed alongside).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch

from draftsmith.config import TargetConfig, config_from_dict
from draftsmith.distill.batching import collate
from draftsmith.distill.losses import forward_kl
from draftsmith.distill.train import setup, train_step
from draftsmith.kinds.independent.init import draft_from_target
from draftsmith.models import load_target, load_target_tokenizer, resolve_model

TEXT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    "Speculative decoding lets a small draft model propose several tokens that the large target "
    "model then verifies in one forward pass, so the output is unchanged but arrives faster. "
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun. "
    "Write a short poem about the sea, the wind and the lighthouse keeper who never sleeps. "
)


def make_dataset(out: Path, target, tok, n: int, k: int, seed: int = 0) -> None:
    """Prompts/completions cut from real text, varied lengths, with the target's top-k."""
    import datasets

    ids = tok(TEXT * 8)["input_ids"]
    g = torch.Generator().manual_seed(seed)
    rows = {
        c: []
        for c in (
            "prompt_ids",
            "completion_ids",
            "category",
            "source",
            "split",
            "topk_ids",
            "topk_logprobs",
        )
    }
    for _ in range(n):
        p = int(torch.randint(16, 48, (1,), generator=g))
        c = int(torch.randint(16, 65, (1,), generator=g))
        start = int(torch.randint(0, len(ids) - p - c, (1,), generator=g))
        seq = ids[start : start + p + c]
        with torch.no_grad():
            logits = target(torch.tensor([seq[:-1]])).logits[0, p - 1 :]  # (c, V)
        vals, top = torch.log_softmax(logits.float(), -1).topk(k, -1)
        for key, v in (
            ("prompt_ids", seq[:p]),
            ("completion_ids", seq[p:]),
            ("category", "mix"),
            ("source", "bench"),
            ("split", "train"),
            ("topk_ids", top.tolist()),
            ("topk_logprobs", vals.tolist()),
        ):
            rows[key].append(v)
    datasets.Dataset.from_dict(rows).save_to_disk(str(out / "data" / "dataset"))


def bench_draftsmith(out: Path, args) -> tuple[float, float, float, object]:
    raw = {
        "run": {"output_dir": str(out), "seed": 0, "device": "cpu"},
        "target": {"model": args.target},
        "draft": {"init": "from_target", "num_layers": 2},
        "data": {"topk_logprobs": args.k},
        "distill": {
            "teacher": "offline",
            "loss": "forward_kl",
            "batch_size": args.batch_size,
            "max_steps": args.warmup + args.steps,
            "lr": args.lr,
            "warmup_steps": 0,
        },
        "tracking": {"wandb": {"mode": "disabled"}},
    }
    cfg = config_from_dict(raw)
    tr = setup(cfg, out / "checkpoints", "forward_kl", None)
    # first-batch offline loss (before any update)
    first = collate(tr.data.examples(tr.plan.global_batch(0)), tr.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = tr.model(first.input_ids, first.attention_mask, first.loss_mask)
        from draftsmith.distill.losses import distill_loss

        ones = torch.ones_like(first.labels, dtype=torch.bool)
        offline_first = (
            distill_loss("forward_kl", logits, first.topk, first.labels, ones).mean().item()
        )
    tokens, seconds = 0.0, 0.0
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        m = train_step(tr, step)
        if step >= args.warmup:
            seconds += time.perf_counter() - t0
            tokens += m["tokens"]
    return tokens / seconds, offline_first, seconds, tr


class _Timer:
    def __init__(self):
        self.tokens, self.seconds, self.step, self.t0 = 0.0, 0.0, 0, 0.0


def bench_trl(dataset_dir: Path, student, teacher, tok, args, timer: _Timer) -> None:
    import datasets
    from transformers import TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    ds = datasets.load_from_disk(str(dataset_dir)).select_columns(["prompt_ids", "completion_ids"])
    pad = tok.pad_token_id

    def collator(rows):
        seqs = [r["prompt_ids"] + r["completion_ids"] for r in rows]
        T = max(map(len, seqs))
        ids = torch.full((len(seqs), T), pad)
        att = torch.zeros(len(seqs), T, dtype=torch.long)
        labels = torch.full((len(seqs), T), -100)
        for b, (r, s) in enumerate(zip(rows, seqs)):
            ids[b, : len(s)], att[b, : len(s)] = torch.tensor(s), 1
            labels[b, len(r["prompt_ids"]) : len(s)] = torch.tensor(r["completion_ids"])
        return {"input_ids": ids, "attention_mask": att, "labels": labels}

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            timer.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if timer.step >= args.warmup:
                timer.seconds += time.perf_counter() - timer.t0
            timer.step += 1

    class CountingGKD(GKDTrainer):
        def compute_loss(self, model, inputs, *a, **kw):
            if timer.step >= args.warmup:
                timer.tokens += float((inputs["labels"] != -100).sum())
            return super().compute_loss(model, inputs, *a, **kw)

    with tempfile.TemporaryDirectory() as tmp:
        gargs = GKDConfig(
            output_dir=tmp,
            per_device_train_batch_size=args.batch_size,
            max_steps=args.warmup + args.steps,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            beta=0.0,
            lmbda=0.0,
            temperature=1.0,
            report_to=[],
            save_strategy="no",
            logging_steps=1000,
            use_cpu=True,
            bf16=False,
            max_length=256,
            dataloader_num_workers=0,
            seed=0,
            gradient_checkpointing=False,
        )
        trainer = CountingGKD(
            model=student,
            teacher_model=teacher,
            args=gargs,
            data_collator=collator,
            train_dataset=ds,
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.train()


def first_batch_losses(tr, teacher) -> tuple[float, float]:
    """draftsmith online forward KL vs TRL's generalized_jsd_loss(beta=0), same batch, same init."""
    from trl.experimental.gkd import GKDTrainer

    batch = collate(tr.data.examples(tr.plan.global_batch(0)), tr.tokenizer.pad_token_id)
    init = tr.init_draft
    with torch.no_grad():
        s = init(batch.input_ids, attention_mask=batch.attention_mask).logits
        t = teacher(batch.input_ids, attention_mask=batch.attention_mask).logits
        ours = forward_kl(s, t, batch.loss_mask).mean().item()
        labels = torch.where(batch.loss_mask, 0, -100)  # any id; only the mask is read
        trl = GKDTrainer.generalized_jsd_loss(s, t, labels=labels, beta=0.0).item()
    return ours, trl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--num-seqs", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-4)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    target_cfg = TargetConfig(model=args.target)
    tok = load_target_tokenizer(target_cfg)
    target = load_target(target_cfg, torch.device("cpu"), torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        make_dataset(out, target, tok, args.num_seqs, args.k)
        print(
            f"data: {args.num_seqs} sequences, top-{args.k} stored ({time.perf_counter() - t0:.0f} s, not timed)"
        )
        init = draft_from_target(target, [0, 1]).eval()
        ds_tps, offline_first, ds_s, tr = bench_draftsmith(out, args)
        tr.init_draft = init
        ours, trl_first = first_batch_losses(tr, target)
        timer = _Timer()
        bench_trl(out / "data" / "dataset", copy.deepcopy(init).train(), target, tok, args, timer)
    trl_tps = timer.tokens / timer.seconds
    print(
        f"target {resolve_model(args.target)}; student from_target layers [0, 1]; batch {args.batch_size}; "
        f"{args.steps} timed steps after {args.warmup} warm-up"
    )
    print(
        f"first-batch forward KL: draftsmith online {ours:.6f}, TRL GKD beta=0 {trl_first:.6f} "
        f"(rel diff {abs(ours - trl_first) / abs(trl_first):.1e}); draftsmith offline top-{args.k} {offline_first:.6f}"
    )
    print(
        f"draftsmith (offline top-{args.k}): {ds_tps:8.1f} completion tokens/s ({ds_s / args.steps:.2f} s/step)"
    )
    print(
        f"TRL GKDTrainer (online):     {trl_tps:8.1f} completion tokens/s "
        f"({timer.seconds / args.steps:.2f} s/step)"
    )
    print(f"ratio draftsmith / TRL: {ds_tps / trl_tps:.2f}x")


if __name__ == "__main__":
    main()
