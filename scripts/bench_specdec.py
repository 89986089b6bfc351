"""Native speculative decoding vs transformers assisted generation vs target-only, one process.

    flock /tmp/draftsmith-bench.lock python scripts/bench_specdec.py [--draft DIR|target] [--k 4]
    python scripts/bench_specdec.py --device cuda --k 1      # on a GPU (fp32 unless --dtype)

Target: --target, default SmolLM2-135M-Instruct (registry smollm2-135m-instruct). Draft: --draft DIR (a trained
checkpoint), --draft target (the target itself: a perfect draft, acceptance 1.0), or by default
a from_target initialisation (the target's first 2 layers; accepts ~1% untrained). Greedy,
fixed k, the same prompts for all three; outputs must be identical. Prints tokens/s, ratios and
measured vs modelled speedup. Targets: native >= 1.25x HF assisted; measured >= 0.9x modelled.

Sweep mode (--sets): each decoder at each of its settings on real prompt sets, one run.

    flock /tmp/draftsmith-bench.lock python scripts/bench_specdec.py \
        --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
        --dtype bfloat16 --sets mtbench:coding mtbench:writing humaneval --prompts 3 \
        --ks 1 2 3 4 6 --thresholds 0.3 0.5 --max-new-tokens 64

A set is a builtin prompt source, optionally cut to one category (`mtbench:writing`); its
first --prompts prompts (MT-bench: round robin; HumanEval: the first) are decoded by every
decoder: target-only (native and transformers' plain generate), the native engine at every
k and at max(ks) with each confidence threshold (engine.DraftContext.stop_below), and
transformers' assisted generation at every k and with each threshold as its own
assistant_confidence_threshold. Decoders are interleaved prompt by prompt (the order
rotated each prompt), every output is checked token-identical to native target-only, and
each decoder's best setting is compared with the other's best, per set and pooled.

--draft-weights int8 int4: the native engine drafts with the draft's weights rounded to each
(evaluate.draft_weights, draftsmith/quant_draft.py), and transformers' assisted generation
runs at every setting with each rounded draft and the draft as loaded, so each decoder is
compared at its own best.

--hf-engine-kernels: transformers' plain and assisted generate (with the last
--draft-weights draft) once more with the engine's linear forms patched into the target
(draftsmith/fast_linear.py, the per-width choice timed at the start). It splits the native
engine's lead over transformers into what its kernels give (the same kernels in HF's
generate) and what its decoding gives on top (native against that).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from draftsmith.config import TargetConfig
from draftsmith.evaluate import metrics
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.evaluate.ranking import near_tie_tolerance, target_tie_gap
from draftsmith.fast_linear import cpu_few_row_linear
from draftsmith.kinds.independent.export import fixed_k_assistant
from draftsmith.models import (
    eos_token_ids,
    load_model,
    load_target,
    load_target_tokenizer,
    pick_device,
    resolve_model,
)
from draftsmith.quant_draft import LAYERS, quantize_draft

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


# ----------------------------------------------------------------------------- sweep mode


def set_prompts(spec: str, tok, n: int) -> list[list[int]]:
    """`mtbench:writing` -> the first n prompts of that builtin set (and category), templated."""
    from draftsmith.config import PromptSource
    from draftsmith.data.sources import encode as encode_text
    from draftsmith.data.sources import load_source, render
    from draftsmith.evaluate.prompts import select_prompts

    builtin, _, category = spec.partition(":")
    prompts = load_source(PromptSource(builtin=builtin), seed=0)
    if category:
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            raise SystemExit(f"--sets {spec}: no prompt of category {category!r}")
    rows = [{"category": p.category, "prompt": p} for p in prompts]
    picked = [r["prompt"] for r in select_prompts(rows, n)]
    return [encode_text(render(p, tok, True, None), tok, True) for p in picked]


def choose_kernels(target, args) -> dict[str, str]:
    """--few-row: {forward width: form of the linear layers} (auto: each form timed against
    F.linear, as evaluate does; on/off: W @ x^T at every width or none)."""
    from draftsmith.fast_linear import FEW_ROW, choose_linear_forms, few_row_counts

    if args.few_row in ("on", "off"):
        return {str(w): FEW_ROW for w in sorted(few_row_counts(args.few_row == "on"))}
    widths = list(range(1, max(args.ks) + 2))  # 1: the decode step
    vocab = target.config.get_text_config().vocab_size
    context = [t % vocab for t in range(1000, 1128)]  # the cost does not depend on the ids
    chosen = choose_linear_forms(target, context, widths, repeats=5)
    print(f"linear forms timed (ms per forward): {chosen['ms']}")
    return chosen["forms"]


def decoders(target, draft, args, eos, pad, rounded=None):
    """{name: fn(prompt_ids) -> (tokens, seconds, result dict or None)}: every setting.
    With `rounded` ({"int8": draft, ...}, --draft-weights) the native engine drafts with each
    of them, and transformers' assisted generation with each and with the draft as loaded
    (each decoder at its own best)."""
    natives = {f"native {w}": m for w, m in (rounded or {}).items()} or {"native": draft}

    def native(k=0, stop=None, proposer=None, second=None):
        dec = SpeculativeDecoder(
            target,
            proposer,
            k=k,
            eos_ids=eos,
            linear_forms=args.few_row,
            stop_below=stop,
            second_choice_min=second,
        )

        def run(ids):
            start = time.perf_counter()
            r = dec.generate(ids, args.max_new_tokens)
            return r.tokens, time.perf_counter() - start, r.to_dict()

        return run

    def hf(k=0, stop=0.0, use_draft=True, assistant=draft, forms=None):
        """transformers' generate; `forms`: with the engine's linear forms (fast_linear)
        patched into the target and the assistant, as the engine runs them."""

        def run(ids):
            kw = dict(
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                eos_token_id=sorted(eos),
                pad_token_id=pad,
            )
            if use_draft:
                assistant.generation_config.update(
                    **{**fixed_k_assistant(k), "assistant_confidence_threshold": stop}
                )
                kw.update(assistant_model=assistant)
            scope = cpu_few_row_linear(target, assistant if use_draft else None, enabled=forms)
            start = time.perf_counter()
            with torch.inference_mode(), scope:
                out = target.generate(torch.tensor([ids], device=target.device), **kw)
            return out[0, len(ids) :].tolist(), time.perf_counter() - start, None

        return run

    k_max = max(args.ks)
    out = {"native target-only": native(), "HF plain": hf(use_draft=False)}
    for tag, d in natives.items():
        out |= {f"{tag} k={k}": native(k, proposer=d) for k in args.ks}
        out |= {f"{tag} k<={k_max} stop<{t:g}": native(k_max, t, d) for t in args.thresholds}
        for m in args.second_choice:  # the engine's second-choice leaves (engine.py)
            out |= {f"{tag} k={k} 2nd>={m:g}": native(k, None, d, m) for k in args.ks}
            out |= {
                f"{tag} k<={k_max} stop<{t:g} 2nd>={m:g}": native(k_max, t, d, m)
                for t in args.thresholds
            }
    assistants = {"HF assisted": draft} | {
        f"HF assisted {w}": m for w, m in (rounded or {}).items()
    }
    for label, a in assistants.items():
        out |= {f"{label} k={k}": hf(k, assistant=a) for k in args.ks}
        out |= {
            f"{label} k<={k_max} stop<{t:g}": hf(k_max, t, assistant=a) for t in args.thresholds
        }
    if args.hf_engine_kernels:  # the last assistant (the roundest draft) with the engine's forms
        label, a = next(reversed(assistants.items()))
        label, f = f"{ENGINE_KERNELS} {label}", args.few_row
        out[f"{ENGINE_KERNELS} HF plain"] = hf(use_draft=False, forms=f)
        out |= {f"{label} k={k}": hf(k, assistant=a, forms=f) for k in args.ks}
        out |= {
            f"{label} k<={k_max} stop<{t:g}": hf(k_max, t, assistant=a, forms=f)
            for t in args.thresholds
        }
    return out


def is_native_spec(name: str) -> bool:
    return name.startswith("native") and name != "native target-only"


FP32_REF = "fp32 target-only (reference)"
ENGINE_KERNELS = "[engine kernels]"  # transformers' generate with the engine's linear forms


def check_same(target, prompt_ids, ref, toks, where: str, ties: dict) -> None:
    """Output equal to the reference, or leaving it first at a near-tie: the target's own
    logits of the two tokens within rounding of each other (in bf16 a multi-token verify pass
    and a 1-token step sum in other orders), counted in `ties`. Anything else is a bug."""
    pos = metrics.first_mismatch(toks, ref)
    if pos is None:
        return
    gap = target_tie_gap(target, prompt_ids, ref, toks, pos)
    tolerance = near_tie_tolerance(target.dtype)
    assert gap is not None and gap <= tolerance, (
        f"{where}: output differs from native target-only at new token {pos} (target logit gap "
        f"{gap}, beyond the near-tie tolerance {tolerance:.3g})"
    )
    name = where.split(": ", 1)[1]
    ties[name] = ties.get(name, 0) + 1


def sweep(target, draft, tok, args, eos, fp32=None, rounded=None) -> None:
    runs = decoders(target, draft, args, eos, tok.pad_token_id, rounded)
    if (
        fp32 is not None
    ):  # timed like the others; its tokens may differ from the low-precision target's
        dec = SpeculativeDecoder(fp32, eos_ids=eos, linear_forms=False)

        def run_fp32(ids):
            start = time.perf_counter()
            r = dec.generate(ids, args.max_new_tokens)
            return r.tokens, time.perf_counter() - start, None

        runs[FP32_REF] = run_fp32
    names = list(runs)
    same_as_fp32 = [0, 0]  # prompts whose fp32 output equals the low-precision one, prompts
    ties: dict[str, int] = {}  # decoder -> prompts that left the reference at a near-tie
    sets = {spec: set_prompts(spec, tok, args.prompts) for spec in args.sets}
    for run in runs.values():  # warm-up: allocator, lazy kernels
        run(next(iter(sets.values()))[0][:32])
    seconds = {(s, n): 0.0 for s in sets for n in names}
    tokens = dict.fromkeys(sets, 0)
    results = {(s, n): [] for s in sets for n in names}
    i = 0
    for spec, prompts in sets.items():
        for ids in prompts:
            order = names[i % len(names) :] + names[: i % len(names)]  # rotated each prompt
            i += 1
            outs = {}
            for name in order:
                toks, dt, res = runs[name](ids)
                outs[name] = toks
                seconds[spec, name] += dt
                if res is not None:
                    results[spec, name].append(res)
            ref = outs["native target-only"]
            if FP32_REF in outs:
                same_as_fp32[0] += outs.pop(FP32_REF) == ref
                same_as_fp32[1] += 1
            for name, toks in outs.items():
                check_same(target, ids, ref, toks, f"{spec}: {name}", ties)
            tokens[spec] += len(ref)
    report_sweep(sets, names, seconds, tokens, results)
    if ties:
        print(
            f"\nnear-ties (first divergence from native target-only where the target's own logits "
            f"of the two tokens are within {near_tie_tolerance(target.dtype):.3g}, relative): "
            + ", ".join(f"{n} {c}" for n, c in sorted(ties.items()))
        )
    if fp32 is not None:
        print(
            f"\nfp32 reference: output equal to the {args.dtype} target's on {same_as_fp32[0]} of "
            f"{same_as_fp32[1]} prompts (not required: another dtype's argmax may differ)"
        )


def report_sweep(sets, names, seconds, tokens, results) -> None:
    checked = [n for n in names if n != FP32_REF]
    print(
        f"\noutputs of all {len(checked)} checked decoders equal native target-only's on every "
        "prompt, or leave it at a near-tie (counted below)"
    )
    pooled = {n: sum(seconds[s, n] for s in sets) for n in names}
    for label, secs, toks in [
        *((s, {n: seconds[s, n] for n in names}, tokens[s]) for s in sets),
        ("pooled", pooled, sum(tokens.values())),
    ]:
        base = toks / secs["native target-only"]
        print(f"\n== {label}: {toks} tokens, native target-only {base:.2f} tokens/s")
        for n in names:
            tps = toks / secs[n]
            extra = ""
            rs = (
                [r for s in sets for r in results[s, n]]
                if label == "pooled"
                else results.get((label, n), [])
            )
            if rs and rs[0]["k"]:
                base_rs = (
                    [r for s in sets for r in results[s, "native target-only"]]
                    if label == "pooled"
                    else results[label, "native target-only"]
                )
                m = metrics.summarize(rs, base_rs, rs[0]["k"])
                extra = (
                    f"  alpha {m['alpha']:.3f}, {m['mean_accepted_length']:.2f} tokens/forward, "
                    f"{m['tokens_proposed'] / max(1, m['target_forwards']):.2f} drafts/round, "
                    f"c {m['draft_cost_ratio']:.3f}, v {m['verify_cost_ratio']:.2f}"
                )
                if "2nd>=" in n:  # leaves: the target's tokens that were the draft's 2nd choice
                    put = sum(r.get("second_proposed", 0) for r in rs)
                    hit = sum(r.get("second_accepted", 0) for r in rs)
                    extra += f", 2nd choices {hit}/{put} emitted"
                elif "stop<" not in n:  # the cost model is for a fixed k (a chain)
                    model = m["modelled_speedup_verify"]
                    extra += f", modelled {model:.2f}x (measured/modelled {tps / base / model:.2f})"
                    request = m["modelled_speedup_request"]
                    if request:  # the same model with the prompts' prefills counted
                        extra += f", with prefills {request:.2f}x ({tps / base / request:.2f})"
            print(f"  {n:48s} {tps:6.2f} tokens/s  {tps / base:5.2f}x{extra}")
        best_native = max((n for n in names if is_native_spec(n)), key=lambda n: -secs[n])
        best_hf = max((n for n in names if n.startswith("HF assisted")), key=lambda n: -secs[n])
        print(
            f"  best native ({best_native}) / best HF assisted ({best_hf}): "
            f"{secs[best_hf] / secs[best_native]:.2f}x; best native / target-only "
            f"{secs['native target-only'] / secs[best_native]:.2f}x; native target-only / HF "
            f"plain {secs['HF plain'] / secs['native target-only']:.2f}x"
        )
        patched = [n for n in names if n.startswith(f"{ENGINE_KERNELS} HF assisted")]
        if patched:  # the lead split: the same kernels in HF, then the decoding on top
            best_patched = max(patched, key=lambda n: -secs[n])
            print(
                f"  of which the engine's kernels (best HF assisted with them, {best_patched}, "
                f"/ best HF assisted) {secs[best_hf] / secs[best_patched]:.2f}x and the "
                f"decoding (best native / that) {secs[best_patched] / secs[best_native]:.2f}x"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=None, help="checkpoint dir, or 'target' (perfect draft)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="(per set with --sets)")
    ap.add_argument("--sets", nargs="*", default=None, help="sweep mode: builtin[:category] ...")
    ap.add_argument("--ks", nargs="*", type=int, default=[1, 2, 3, 4], help="sweep mode")
    ap.add_argument("--thresholds", nargs="*", type=float, default=[], help="sweep mode")
    ap.add_argument(
        "--second-choice",
        nargs="*",
        type=float,
        default=[],
        help="sweep mode: also the native engine with second-choice leaves at each min gain",
    )
    ap.add_argument(
        "--few-row",
        default="auto",
        help="sweep mode: the linear layers' form per forward width (auto: F.linear, W @ x^T and "
        "packed weights timed here, as evaluate does; on: W @ x^T everywhere; off: F.linear)",
    )
    ap.add_argument(
        "--hf-engine-kernels",
        action="store_true",
        help="sweep mode: also transformers' plain and assisted generate (with the last "
        "--draft-weights draft) with the engine's linear forms patched in, to split the "
        "engine's lead into its target forward and its decoding",
    )
    ap.add_argument("--target", default="smollm2-135m-instruct", help="registry name or dir")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument(
        "--fp32-reference",
        action="store_true",
        help="sweep mode with --dtype bfloat16/float16: also time target-only decoding of an fp32 "
        "copy of the target (its tokens may differ: counted, not required equal)",
    )
    ap.add_argument(
        "--draft-weights",
        nargs="*",
        default=[],
        choices=list(LAYERS),
        help="sweep mode: the native engine drafts with the draft's weights rounded to each "
        "(evaluate.draft_weights); transformers' assisted generation runs with each rounded "
        "and the as-loaded draft",
    )
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
    if args.sets:
        draft = load_model(args.draft, device=device, dtype=dtype, key="--draft")
        eos = eos_token_ids(tok, target.generation_config)
        args.few_row = choose_kernels(target, args)
        print(f"target {path}, draft {args.draft}, {args.dtype}, linear forms {args.few_row}")
        fp32 = None
        if args.fp32_reference and dtype != torch.float32:
            fp32 = load_target(target_cfg, device, torch.float32)
        rounded = {}
        for weights in args.draft_weights:
            rounded[weights] = copy.deepcopy(draft)
            info = quantize_draft(rounded[weights], weights, target)
            print(
                f"--draft-weights {weights}: {info['layers']} linear layers of the draft at "
                f"input widths {info['kernel_widths']} (timed here: {info['ms']})"
            )
        return sweep(target, draft, tok, args, eos, fp32, rounded)
    if args.draft_weights:
        raise SystemExit("--draft-weights: sweep mode only (give --sets)")
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
    flin_dec = SpeculativeDecoder(target, draft, k=k, eos_ids=eos, linear_forms=False)
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
