"""Target-only greedy decoding, one token per forward, with every one-row matmul as F.linear
(what the engine's target-only baseline did until 2026-12-06) against the same row padded to
two and taken as W @ x^T (draftsmith/fast_linear.py with width 1 chosen, the engine's own
code path); interleaved, same tokens checked.

    python scripts/bench_one_row.py [--model qwen2.5-coder-1.5b-instruct] [--dtype bfloat16]
        [--tokens 32] [--repeats 3]

Why: in bf16 on this CPU a two-row W @ x^T product runs faster than a one-row one, so a
baseline decoded with one-row F.linear is slower than target-only decoding has to be, and
every speedup measured against it is inflated by the ratio printed here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.fast_linear import cpu_few_row_linear
from draftsmith.models import load_model, load_tokenizer


@torch.no_grad()
def decode(model, ids, tokens: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    out = model(ids, use_cache=True)
    past, tok, got = out.past_key_values, out.logits[:, -1:].argmax(-1), []
    for _ in range(tokens):
        got.append(int(tok))
        out = model(tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return got, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = load_model(
        args.model, device=torch.device("cpu"), dtype=getattr(torch, args.dtype)
    ).eval()
    tok = load_tokenizer(args.model)
    msgs = [{"role": "user", "content": "Write a short travel blog post about a trip to Hawaii."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    widths = {"F.linear, 1 row": False, "W @ x^T, padded to 2 rows": [1]}
    times = {name: [] for name in widths}
    outputs = {}
    for _ in range(args.repeats):
        for name, enabled in widths.items():  # interleaved
            with cpu_few_row_linear(model, enabled=enabled):
                got, s = decode(model, ids, args.tokens)
            times[name].append(s)
            outputs.setdefault(name, got)
    base = statistics.median(times["F.linear, 1 row"])
    for name, ts in times.items():
        t = statistics.median(ts)
        print(
            f"{name:28s} {args.tokens / t:6.2f} tokens/s  ({base / t:.3f}x the F.linear baseline)"
        )
    same = outputs["F.linear, 1 row"] == outputs["W @ x^T, padded to 2 rows"]
    print(f"same tokens: {same}")


if __name__ == "__main__":
    main()
