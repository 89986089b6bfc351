"""Batched HF backend vs one-prompt-at-a-time `model.generate`, same prompts, one process.

    flock /tmp/draftsmith-bench.lock python scripts/bench_generate.py
    python scripts/bench_generate.py --model tiny-random-llama --prompts 8   # quick smoke run

Both sides decode greedily with the same new-token budget and stop at EOS;
tokens/s counts only real generated tokens (up to and including EOS), so the
padding a batch carries after a row finishes is not counted for the batch.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftsmith.config import DataConfig, PromptSource
from draftsmith.data.completion import cut_at_eos
from draftsmith.data.hf_backend import HFBackend
from draftsmith.data.sources import encode, load_source, render
from draftsmith.models import load_model, load_tokenizer


def bench_prompts(tok, n: int) -> list[list[int]]:
    prompts = load_source(PromptSource(builtin="draftsmith", limit=n), seed=0)
    texts = [render(p, tok, chat_template=True, system_prompt=None) for p in prompts]
    return [encode(t, tok, templated=bool(tok.chat_template)) for t in texts]


@torch.no_grad()
def one_at_a_time(model, tok, prompts, max_new_tokens: int, eos: set[int]) -> list[list[int]]:
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        seq = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=tok.pad_token_id,
        )[0, len(p) :].tolist()
        outs.append(seq[: cut_at_eos(seq, eos)[0]])
    return outs


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tok = load_tokenizer(args.model)
    model = load_model(args.model, device=torch.device("cpu"), dtype=torch.float32)
    prompts = bench_prompts(tok, args.prompts)
    backend = HFBackend(
        model, tok, DataConfig(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    )
    backend.generate(prompts[:2], seed=0)  # warm-up: first-call allocations, thread pools

    batched, t_batched = timed(lambda: backend.generate(prompts, seed=0))
    batched = [c[0].token_ids for c in batched]
    single, t_single = timed(
        lambda: one_at_a_time(model, tok, prompts, args.max_new_tokens, backend.eos_ids)
    )

    n_b, n_s = sum(map(len, batched)), sum(map(len, single))
    same = sum(a == b for a, b in zip(batched, single))
    tps_b, tps_s = n_b / t_batched, n_s / t_single
    print(
        f"model {args.model}, {len(prompts)} prompts "
        f"(prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}), "
        f"max_new_tokens {args.max_new_tokens}, {args.threads} threads"
    )
    print(
        f"one-at-a-time model.generate : {n_s:5d} tokens in {t_single:7.2f} s = {tps_s:7.1f} tok/s"
    )
    print(
        f"batched HF backend (batch {args.batch_size:2d}): {n_b:5d} tokens in {t_batched:7.2f} s "
        f"= {tps_b:7.1f} tok/s"
    )
    print(f"speedup {tps_b / tps_s:.2f}x; identical greedy completions {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
