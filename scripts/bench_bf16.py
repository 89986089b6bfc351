"""The target's batched work in fp32 vs bf16, side by side in one process.

    flock /tmp/draftsmith-bench.lock python scripts/bench_bf16.py [--repeats 3]

Three workloads, each timed in fp32 and in bf16 alternately (fp32, bf16, fp32, bf16, ...)
so a change in the machine's load hits both; the figure is the median over repeats:
  generate  the HF backend's batched decode loop: --gen-prompts prompts x --new-tokens, greedy
  score     score_batch: --score-rows sequences of --score-len tokens, top-32 log-probs
  train     one distill forward + backward of a 2-layer from_target draft on --score-rows
            sequences (fp32 weights; bf16 is accelerate's autocast, as distill runs it)
Tokens/s and the bf16/fp32 ratio are printed; the first repeat is a warm-up and dropped.
bf16 changes numbers, not just speed: the script also prints how many greedy tokens and
top-1 scored ids agree with fp32 (the README's paired comparison of drafts trained on each
answers whether that matters).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.config import DataConfig, DraftConfig, PromptSource, TargetConfig
from draftsmith.data.hf_backend import HFBackend, score_batch
from draftsmith.data.sources import encode, load_source, render
from draftsmith.distill.losses import cross_entropy
from draftsmith.distill.teacher import CompletionLogits
from draftsmith.kinds.independent.init import draft_from_target, select_layers
from draftsmith.models import cpu_has_native_bf16, load_target, load_target_tokenizer


def chat_prompts(tok, n: int) -> list[list[int]]:
    prompts = load_source(PromptSource(builtin="draftsmith", limit=n), seed=0)
    return [encode(render(p, tok, True, None), tok, templated=True) for p in prompts]


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_generate(models: dict, tok, prompts, new_tokens: int):
    dcfg = DataConfig(max_new_tokens=new_tokens, batch_size=len(prompts), max_batch_tokens=None)
    backends = {k: HFBackend(m, tok, dcfg) for k, m in models.items()}

    def run(kind):
        secs, comps = timed(lambda: backends[kind].generate(prompts, seed=0))
        tokens = [c.token_ids for cs in comps for c in cs]
        return sum(map(len, tokens)) / secs, tokens

    return run


def bench_score(models: dict, pairs, pad_id: int):
    def run(kind):
        secs, comps = timed(lambda: score_batch(models[kind], pairs, pad_id=pad_id, topk=32))
        top1 = [row[0] for c in comps for row in c.topk_ids]
        return sum(len(r) for _, r in pairs) / secs, top1

    return run


def bench_train(target_fp32, pairs):
    """One forward + backward of a 2-layer draft, head on the reply positions (as distill)."""
    draft = draft_from_target(
        target_fp32, select_layers(DraftConfig(num_layers=2), target_fp32.config.num_hidden_layers)
    ).train()
    model = CompletionLogits(draft)
    ids = torch.tensor([p + r for p, r in pairs])  # (B, T), equal lengths: no padding
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    mask[:, len(pairs[0][0]) - 1 : -1] = True  # positions predicting the reply tokens
    labels = ids[:, len(pairs[0][0]) :].reshape(-1)  # (N,)
    attn = torch.ones_like(ids)

    def run(kind):
        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "bf16"):
                logits = model(ids, attn, mask)  # (N, V)
            cross_entropy(
                logits, labels, torch.ones_like(labels, dtype=torch.bool)
            ).total.backward()
            draft.zero_grad(set_to_none=True)

        secs, _ = timed(step)
        return ids.numel() / secs, None

    return run


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> int:
    """Tokens equal before each sequence's first difference (greedy paths part at a flip)."""
    same = 0
    for s, t in zip(a, b):
        for x, y in zip(s, t):
            if x != y:
                break
            same += 1
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gen-prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--score-rows", type=int, default=16)
    ap.add_argument("--score-len", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(2)
    tcfg = TargetConfig(model=args.model)
    tok = load_target_tokenizer(tcfg)
    cpu = torch.device("cpu")
    fp32 = load_target(tcfg, cpu, torch.float32)
    models = {"fp32": fp32, "bf16": load_target(tcfg, cpu, torch.bfloat16)}
    print(f"native bf16 matmuls on this CPU (AVX512-BF16/AMX): {cpu_has_native_bf16()}")
    prompts = chat_prompts(tok, args.gen_prompts)
    long = chat_prompts(tok, 200)
    stream = [t for p in long for t in p]
    half = args.score_len // 2
    pairs = [
        (
            stream[i * args.score_len : i * args.score_len + half],
            stream[i * args.score_len + half : (i + 1) * args.score_len],
        )
        for i in range(args.score_rows)
    ]
    runs = {
        "generate": bench_generate(models, tok, prompts, args.new_tokens),
        "score": bench_score(models, pairs, tok.pad_token_id),
        "train": bench_train(fp32, pairs),
    }
    for name, run in runs.items():
        speed = {"fp32": [], "bf16": []}
        outputs = {}
        for rep in range(args.repeats + 1):
            for kind in ("fp32", "bf16"):
                tps, out = run(kind)
                outputs[kind] = out
                if rep:  # the first round warms both up
                    speed[kind].append(tps)
        f, b = statistics.median(speed["fp32"]), statistics.median(speed["bf16"])
        line = f"{name:9s} fp32 {f:8.1f} tok/s  bf16 {b:8.1f} tok/s  bf16/fp32 {b / f:.2f}x"
        line += f"  (spread fp32 {min(speed['fp32']):.0f}-{max(speed['fp32']):.0f}, "
        line += f"bf16 {min(speed['bf16']):.0f}-{max(speed['bf16']):.0f})"
        if name == "generate":
            a, c = outputs["fp32"], outputs["bf16"]
            same = prefix_agreement(a, c)
            line += f"; greedy tokens equal to fp32 before the first difference: {same}"
            line += f" of {sum(map(len, a))}"
        elif name == "score":
            a, c = outputs["fp32"], outputs["bf16"]
            line += f"; top-1 ids equal: {sum(x == y for x, y in zip(a, c))} of {len(a)}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
