"""The HF backend's decode loop vs batched and one-at-a-time `model.generate`, one process.

    flock /tmp/draftsmith-bench.lock python scripts/bench_generate.py
    python scripts/bench_generate.py --model tiny-random-llama --prompts 8   # quick smoke run
    python scripts/bench_generate.py --model qwen2.5-coder-1.5b-instruct --batch-size 32 \
        --max-new-tokens 32 --skip-single     # the pair's target at the data stage's batch

All decode greedily with the same new-token budget and stop at EOS; the batched peer
gets the backend's own length buckets and batch size, and stores the same top-k
log-probs (`output_logits`). The backend runs twice: with its decode steps' linear
layers in the forms timed fastest on this machine (data.cpu_few_row_linear: auto, the
stage's default; the timing itself is reported, not counted) and with F.linear
throughout, as before that choice existed. tokens/s counts only real generated tokens
(up to and including EOS), so the padding a batch carries after a row finishes is not
counted for the batch. The dtype is the stage's (target.batch_dtype auto) unless given.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftsmith.config import DataConfig, PromptSource, TargetConfig
from draftsmith.data.completion import cut_at_eos
from draftsmith.data.hf_backend import HFBackend, decode_linear_forms, left_pad, length_buckets
from draftsmith.data.sources import encode, load_source, render
from draftsmith.models import load_target, load_target_tokenizer, pick_batch_dtype
from draftsmith.vocab_rows import token_id_count


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


@torch.no_grad()
def batched_generate(model, tok, prompts, batch_size, max_new_tokens, eos, topk):
    """model.generate over the backend's length buckets (what the backend did before its loop)."""
    outs = [None] * len(prompts)
    for idx in length_buckets([len(p) for p in prompts], batch_size):
        ids, mask = left_pad([prompts[i] for i in idx], tok.pad_token_id)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=tok.pad_token_id,
            output_logits=topk > 0,
            return_dict_in_generate=True,
        )
        if topk:  # the top-k teacher the backend stores, from the same logits
            [step.float().log_softmax(-1).topk(topk, -1) for step in out.logits]
        for i, seq in zip(idx, out.sequences[:, ids.shape[1] :].tolist()):
            outs[i] = seq[: cut_at_eos(seq, eos)[0]]
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
    ap.add_argument("--topk", type=int, default=32, help="top-k log-probs stored per token")
    ap.add_argument("--skip-single", action="store_true", help="leave out one-at-a-time")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    target_cfg = TargetConfig(model=args.model, batch_dtype=args.dtype)
    tok = load_target_tokenizer(target_cfg)
    dtype = pick_batch_dtype(target_cfg, torch.device("cpu"))
    model = load_target(target_cfg, torch.device("cpu"), dtype)
    prompts = bench_prompts(tok, args.prompts)
    dcfg = DataConfig(
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, topk_logprobs=args.topk
    )
    forms = decode_linear_forms(model, dcfg, token_id_count(tok))  # prints the choice
    backend = HFBackend(model, tok, dcfg, linear_forms=forms)
    plain = HFBackend(model, tok, dcfg)  # F.linear at every width
    for b in (backend, plain):
        b.generate(prompts[:2], seed=0)  # warm-up: first-call allocations, thread pools
    eos, n = backend.eos_ids, args.max_new_tokens

    ours, t_ours = timed(lambda: backend.generate(prompts, seed=0))
    ours = [c[0].token_ids for c in ours]
    flin, t_flin = timed(lambda: plain.generate(prompts, seed=0))
    flin = [c[0].token_ids for c in flin]
    peer, t_peer = timed(
        lambda: batched_generate(model, tok, prompts, args.batch_size, n, eos, args.topk)
    )
    print(
        f"model {args.model}, {len(prompts)} prompts "
        f"(prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}), "
        f"max_new_tokens {n}, top-k {args.topk}, {args.threads} threads, {dtype}"
    )
    tokens = sum(map(len, ours))
    rows = [
        ("HF backend decode loop", ours, t_ours),
        ("decode loop, F.linear only", flin, t_flin),
        ("batched model.generate", peer, t_peer),
    ]
    if not args.skip_single:
        single, t_single = timed(lambda: one_at_a_time(model, tok, prompts, n, eos))
        rows.append(("one-at-a-time model.generate", single, t_single))
    for name, outs, t in rows:
        same = sum(a == b for a, b in zip(outs, ours))
        print(
            f"{name:30s}: {tokens:5d} tokens in {t:7.2f} s = {tokens / t:7.1f} tok/s "
            f"(identical completions {same}/{len(prompts)})"
        )
    print(f"decode loop / the same loop on F.linear: {t_flin / t_ours:.2f}x")
    print(f"decode loop / batched model.generate: {t_peer / t_ours:.2f}x")
    if not args.skip_single:
        print(f"decode loop / one-at-a-time model.generate: {t_single / t_ours:.2f}x")


if __name__ == "__main__":
    main()
