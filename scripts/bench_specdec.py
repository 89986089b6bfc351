"""Native speculative decoding vs transformers assisted generation vs target-only, one process.

    flock /tmp/draftsmith-bench.lock python scripts/bench_specdec.py [--draft DIR|target] [--k 4]
    python scripts/bench_specdec.py --device cuda --k 1      # on a GPU (fp32 unless --dtype)

Target: --target, default SmolLM2-135M-Instruct (registry smollm2-135m-instruct). Draft: --draft DIR (a trained
checkpoint), --draft target (the target itself: a perfect draft, acceptance 1.0), or by default
a from_target initialisation (the target's first 2 layers; accepts ~1% untrained). Greedy,
fixed k, the same prompts for all three; outputs must be identical. Prints tokens/s, ratios and
measured vs modelled speedup. Targets: native >= 1.25x HF assisted; measured >= 0.9x modelled.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from draftsmith.config import TargetConfig
from draftsmith.evaluate import metrics
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.hf_export import fixed_k_assistant
from draftsmith.models import (
    eos_token_ids,
    load_model,
    load_target,
    load_target_tokenizer,
    pick_device,
    resolve_model,
)

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain why the sky is blue in two sentences.",
    "List three tips for writing clear documentation.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet.",
    "def fibonacci(n):",
]


def trimmed_draft(target, keep: int = 2):
    """from_target init: a copy of the target keeping its first `keep` layers."""
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:keep]
    for i, layer in enumerate(draft.model.layers):
        layer.self_attn.layer_idx = i  # the KV cache is indexed by layer_idx
    draft.config.num_hidden_layers = keep
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:keep]
    return draft


def encode(tok, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def run_native(decoder, prompts, max_new):
    outs, results, start = [], [], time.perf_counter()
    for ids in prompts:
        r = decoder.generate(ids, max_new)
        outs.append(r.tokens)
        results.append(r.to_dict())
    return outs, results, time.perf_counter() - start


@torch.inference_mode()
def run_hf(target, draft, prompts, max_new, k, eos, pad):
    outs, start = [], time.perf_counter()
    for ids in prompts:
        kw = dict(
            max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(eos), pad_token_id=pad
        )
        if draft is not None:
            draft.generation_config.update(**fixed_k_assistant(k))  # what the engine does
            kw.update(assistant_model=draft)
        out = target.generate(torch.tensor([ids], device=target.device), **kw)
        outs.append(out[0, len(ids) :].tolist())
    return outs, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=None, help="checkpoint dir, or 'target' (perfect draft)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--target", default="smollm2-135m-instruct", help="registry name or dir")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="fp32 keeps the identical-output checks free of low-precision near-ties",
    )
    args = ap.parse_args()
    torch.set_num_threads(2)

    device, dtype = pick_device(args.device), getattr(torch, args.dtype)
    target_cfg = TargetConfig(model=args.target)
    path = resolve_model(args.target, "--target")
    tok = load_target_tokenizer(target_cfg)
    target = load_target(target_cfg, device, dtype)
    if args.draft == "target":
        draft, name = target, "target itself (perfect draft)"
    elif args.draft:
        draft = load_model(args.draft, device=device, dtype=dtype, key="--draft")
        name = args.draft
    else:
        draft, name = trimmed_draft(target).eval(), "from_target, first 2 layers (untrained)"
    eos = eos_token_ids(tok, target.generation_config)
    prompts = [encode(tok, t) for t in PROMPTS[: args.prompts]]
    k, n = args.k, args.max_new_tokens
    print(
        f"target {path}\ndraft  {name}\nk={k}, max_new_tokens={n}, {len(prompts)} prompts, "
        f"greedy, {device} {args.dtype}, {torch.get_num_threads()} threads"
    )

    base_dec = SpeculativeDecoder(target, eos_ids=eos)
    spec_dec = SpeculativeDecoder(target, draft, k=k, eos_ids=eos)
    # the same engine with every matmul through F.linear: what fast_linear.py buys
    flin_dec = SpeculativeDecoder(target, draft, k=k, eos_ids=eos, few_row_linear=False)
    for dec in (base_dec, spec_dec, flin_dec):  # warm-up
        dec.generate(prompts[0], 4)
    run_hf(target, draft, prompts[:1], 4, k, eos, tok.pad_token_id)

    base_out, base_res, base_t = run_native(base_dec, prompts, n)
    spec_out, spec_res, spec_t = run_native(spec_dec, prompts, n)
    flin_out, flin_res, flin_t = run_native(flin_dec, prompts, n)
    hf_out, hf_t = run_hf(target, draft, prompts, n, k, eos, tok.pad_token_id)
    hfp_out, hfp_t = run_hf(target, None, prompts, n, k, eos, tok.pad_token_id)

    assert spec_out == base_out, "native speculative output differs from target-only"
    assert flin_out == base_out, "native speculative (F.linear) differs from target-only"
    assert hf_out == base_out, "HF assisted output differs from native target-only"
    assert hfp_out == base_out, "HF plain greedy differs from native target-only"
    tokens = sum(map(len, base_out))
    s = metrics.summarize(spec_res, base_res, k)
    tps = {
        name: tokens / t
        for name, t in (
            ("native target-only", base_t),
            ("native speculative", spec_t),
            ("native spec, F.linear", flin_t),
            ("HF assisted", hf_t),
            ("HF plain generate", hfp_t),
        )
    }
    print(f"\noutputs identical across all five ({tokens} tokens)")
    for name, v in tps.items():
        print(f"  {name:22s} {v:7.1f} tokens/s")
    print(
        f"acceptance rate {s['acceptance_rate']:.3f} (accepted/proposed), alpha {s['alpha']:.3f} "
        f"(accepted/verified), mean accepted length {s['mean_accepted_length']:.2f}, "
        f"draft cost ratio c {s['draft_cost_ratio']:.3f}, verify cost ratio v "
        f"{s['verify_cost_ratio']:.2f} ({s['target_verify_ms']:.1f} ms vs 1-token "
        f"{s['target_forward_ms']:.1f} ms)"
    )
    v_flin = metrics.summarize(flin_res, base_res, k)["verify_cost_ratio"]
    print(
        f"few-row linear: verify cost ratio {s['verify_cost_ratio']:.2f} vs {v_flin:.2f} with "
        f"F.linear; speculative tokens/s {flin_t / spec_t:.2f}x"
    )
    native_vs_hf = tps["native speculative"] / tps["HF assisted"]
    measured = tps["native speculative"] / tps["native target-only"]
    print(f"native speculative / HF assisted:      {native_vs_hf:.2f}x (target >= 1.25x)")
    print(
        f"native target-only / HF plain generate: "
        f"{tps['native target-only'] / tps['HF plain generate']:.2f}x"
    )
    print(
        f"measured speedup {measured:.2f}x vs modelled {s['modelled_speedup']:.2f}x: "
        f"ratio {measured / s['modelled_speedup']:.2f} (target >= 0.9; the model counts a "
        f"verify forward as 1)"
    )
    print(
        f"measured speedup {measured:.2f}x vs modelled with the measured verify cost "
        f"{s['modelled_speedup_verify']:.2f}x: ratio {measured / s['modelled_speedup_verify']:.2f}"
    )


if __name__ == "__main__":
    main()
