"""The eagle3 head's draft cost ratio c in the real engine, by draft vocabulary size.

    flock /tmp/draftsmith-bench.lock python scripts/bench_eagle3.py [--vocab 8192 16384 32000]
        [--threads 2]

On the target (default SmolLM2-135M-Instruct, fp32, CPU): target-only decoding and
speculative decoding with an eagle3 head (aux layers (2, n//2, n-3), one Llama layer of the
target's widths, draft vocabulary of each size; random weights: the cost does not depend
on them), plus the independent 2-layer from_target draft for reference, all through
SpeculativeDecoder with its timers. c = mean 1-token draft forward / mean 1-token target
forward, computed within each repeat (the configurations run interleaved, so a load spike
on this shared machine hits them alike); prints the median and the range over repeats.
Greedy outputs must equal target-only's (lossless) for every configuration.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from draftsmith.config import TargetConfig
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.kinds.eagle3.head import Eagle3Head
from draftsmith.kinds.eagle3.proposer import Eagle3Proposer
from draftsmith.kinds.eagle3.vocab import build_draft_vocab
from draftsmith.models import eos_token_ids, load_target, load_target_tokenizer, pick_device

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain why the sky is blue in two sentences.",
    "List three tips for writing clear documentation.",
    "Summarise the plot of Romeo and Juliet.",
]


def encode(tok, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def head_for(target, size: int, aux=None) -> Eagle3Head:
    V = target.config.vocab_size
    counts = torch.randint(0, 1000, (V,), generator=torch.Generator().manual_seed(size))
    torch.manual_seed(0)
    return Eagle3Head.from_target(target, build_draft_vocab(counts, size, V), aux).eval()


def decode(decoder, prompts, max_new) -> tuple[list[list[int]], float, int]:
    """Outputs, summed 1-token draft (or, target-only, target) seconds and their count."""
    outs, secs, n = [], 0.0, 0
    for ids in prompts:
        r = decoder.generate(ids, max_new)
        outs.append(r.tokens)
        if decoder.proposer is None:
            secs, n = secs + r.target_1tok_time, n + r.target_1tok_n
        else:
            secs, n = secs + r.draft_1tok_time, n + r.draft_1tok_n
    return outs, secs, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[8192, 16384, 32000])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--target", default="smollm2-135m-instruct", help="registry name or dir")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--aux", type=int, nargs=3, default=None, help="default (2, n//2, n-3)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import copy

    device = pick_device(args.device)
    target_cfg = TargetConfig(model=args.target)
    tok = load_target_tokenizer(target_cfg)
    target = load_target(target_cfg, device, torch.float32)
    eos = eos_token_ids(tok, target.generation_config)
    prompts = [encode(tok, p) for p in PROMPTS[: args.prompts]]

    independent = copy.deepcopy(target)  # the from_target init: the target's first 2 layers
    independent.model.layers = independent.model.layers[:2]
    independent.config.num_hidden_layers = 2
    decoders = {"target-only": SpeculativeDecoder(target, eos_ids=eos)}
    decoders["independent 2-layer"] = SpeculativeDecoder(target, independent, k=args.k, eos_ids=eos)
    for size in args.vocab:
        head = head_for(target, size, args.aux).to(device)
        decoders[f"eagle3 Vd={size}"] = SpeculativeDecoder(
            target, Eagle3Proposer(head), k=args.k, eos_ids=eos
        )
    n_params = {name: None for name in decoders}
    for name, dec in decoders.items():
        if dec.proposer is not None:
            n_params[name] = sum(p.numel() for p in dec.proposer.module.parameters())

    for dec in decoders.values():  # warm-up, untimed
        dec.generate(prompts[0], 4)
    ratios = {name: [] for name in decoders if name != "target-only"}
    ref = None
    for rep in range(args.repeats):
        per = {}
        for name, dec in decoders.items():
            outs, secs, n = decode(dec, prompts, args.max_new_tokens)
            if ref is None:
                ref = outs
            assert outs == ref, f"{name}: output differs from target-only (not lossless)"
            per[name] = secs / n
        for name in ratios:
            ratios[name].append(per[name] / per["target-only"])
        print(
            f"repeat {rep + 1}: target 1-token forward {1e3 * per['target-only']:.2f} ms; "
            + ", ".join(f"{name} c={ratios[name][-1]:.3f}" for name in ratios),
            flush=True,
        )
    print(
        f"\n{args.target}, k={args.k}, {len(prompts)} prompts x {args.max_new_tokens} tokens, "
        f"{args.repeats} interleaved repeats, {device}, fp32, torch threads {args.threads}"
    )
    print(f"{'draft':<22} {'params':>8} {'c median':>9} {'c range':>15}")
    for name, rs in ratios.items():
        print(
            f"{name:<22} {n_params[name] / 1e6:>7.2f}M {statistics.median(rs):>9.3f} "
            f"{min(rs):>7.3f}-{max(rs):.3f}"
        )


if __name__ == "__main__":
    main()
