"""Second-choice leaves under sampling: the native engine with and without leaves, against
target-only decoding, one run, interleaved prompt by prompt.

    flock /tmp/draftsmith-bench.lock python scripts/bench_sampled_leaves.py \
        --target qwen2.5-coder-1.5b-instruct \
        --draft ~/.cache/draftsmith/models/qwen2.5-coder-0.5b-instruct --dtype bfloat16 \
        --draft-weights int4 --sets mtbench --prompts 8 --seeds 2 --temperature 0.7 \
        --k 5 --threshold 0.6 --second-choice 0.02 0.05 --max-new-tokens 64

Decoders: the target alone, the engine's chain (k, stopping after a draft below
--threshold) and the same with leaves at each --second-choice min gain. Every decoder
decodes every prompt under every seed, the decoders' order rotated at each (prompt, seed).
Sampled outputs differ between decoders (each draws its own tokens), so there is no token
check: exactness under sampling is what the chi-square tests check (tests/test_specdec.py).
What this measures is what leaves buy: tokens per target forward, leaves emitted of those
verified, and tokens/s as a ratio to the target alone over the same prompts and seeds.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from bench_specdec import choose_kernels, set_prompts

from draftsmith.config import TargetConfig
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.models import (
    eos_token_ids,
    load_model,
    load_target,
    load_target_tokenizer,
    pick_device,
)
from draftsmith.quant_draft import LAYERS, quantize_draft
from draftsmith.sampling import SamplingConfig
from draftsmith.vocab_rows import token_id_count

FIELDS = ("tokens", "seconds", "forwards", "proposed", "accepted", "leaves", "leaf_hits")


def build(target, draft, args, eos, vocab, forms) -> dict[str, SpeculativeDecoder]:
    """{name: decoder}: the target alone, the chain, and the chain with each leaves gain."""
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p)

    def engine(proposer=None, k=0, second=None):
        return SpeculativeDecoder(
            target,
            proposer,
            k=k,
            sampling=sampling,
            eos_ids=eos,
            linear_forms=forms,
            num_ids=vocab,
            stop_below=args.threshold if proposer is not None else None,
            second_choice_min=second,
        )

    out = {"target only": engine(), "chain": engine(draft, args.k)}
    for m in args.second_choice:
        out[f"leaves >= {m:g}"] = engine(draft, args.k, m)
    return out


def run(decoders: dict, prompts: list[list[int]], args) -> dict[str, dict]:
    """Every decoder on every (prompt, seed), the order rotated each time -> summed counts."""
    totals = {name: dict.fromkeys(FIELDS, 0.0) for name in decoders}
    names = list(decoders)
    for dec in decoders.values():  # first-call costs outside the timing
        dec.generate(prompts[0], 4, seed=0)
    cases = [(i, s) for i in range(len(prompts)) for s in range(args.seeds)]
    for turn, (i, seed) in enumerate(cases):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            start = time.perf_counter()
            r = decoders[name].generate(prompts[i], args.max_new_tokens, seed=seed)
            got = (len(r.tokens), time.perf_counter() - start, r.target_forwards)
            got += (r.proposed, r.accepted, r.second_proposed, r.second_accepted)
            for key, value in zip(FIELDS, got):
                totals[name][key] += value
        print(f"  {turn + 1}/{len(cases)} prompt {i} seed {seed}", flush=True)
    return totals


def report(totals: dict[str, dict]) -> None:
    base = totals["target only"]
    base_rate = base["tokens"] / base["seconds"]
    print(
        f"{'decoder':<16} {'tok/s':>7} {'speedup':>8} {'tok/fwd':>8} {'accept':>7} leaves emitted"
    )
    for name, t in totals.items():
        rate = t["tokens"] / t["seconds"]
        accept = f"{t['accepted'] / t['proposed']:.3f}" if t["proposed"] else "-"
        leaves = f"{t['leaf_hits']:.0f} of {t['leaves']:.0f}" if t["leaves"] else "-"
        print(
            f"{name:<16} {rate:7.2f} {rate / base_rate:7.2f}x "
            f"{t['tokens'] / t['forwards']:8.3f} {accept:>7} {leaves}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="registry name or dir")
    ap.add_argument("--draft", required=True, help="a draft model dir")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--draft-weights", default="as_loaded", choices=["as_loaded", *LAYERS])
    ap.add_argument("--sets", nargs="+", default=["mtbench"], help="builtin[:category] ...")
    ap.add_argument("--prompts", type=int, default=8, help="per set")
    ap.add_argument("--seeds", type=int, default=2, help="sampling seeds per prompt")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--threshold", type=float, default=0.6, help="the chain's stop threshold")
    ap.add_argument("--second-choice", nargs="+", type=float, default=[0.05])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    if args.temperature <= 0:
        raise SystemExit("--temperature: leaves under sampling need a temperature > 0")
    torch.set_num_threads(2)

    device, dtype = pick_device("cpu"), getattr(torch, args.dtype)
    target_cfg = TargetConfig(model=args.target)
    tok = load_target_tokenizer(target_cfg)
    target = load_target(target_cfg, device, dtype)
    draft = load_model(args.draft, device=device, dtype=dtype, key="--draft")
    if args.draft_weights != "as_loaded":
        quantize_draft(draft, args.draft_weights, target)
    # the verify widths a round with leaves reaches: k drafts, up to k leaves, seq[-1]
    forms = choose_kernels(target, SimpleNamespace(few_row="auto", ks=[2 * args.k]))
    eos = eos_token_ids(tok, target.generation_config)
    prompts = [ids for spec in args.sets for ids in set_prompts(spec, tok, args.prompts)]
    print(
        f"{len(prompts)} prompts x {args.seeds} seeds, temperature {args.temperature:g}, "
        f"top_p {args.top_p:g}, k={args.k}, stop < {args.threshold:g}, draft "
        f"{args.draft_weights}, linear forms {forms}"
    )
    decoders = build(target, draft, args, eos, token_id_count(tok), forms)
    report(run(decoders, prompts, args))


if __name__ == "__main__":
    main()
