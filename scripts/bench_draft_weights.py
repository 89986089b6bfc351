"""A draft's decode step with its weights as loaded, in int8 and in int4, side by side.

    flock /tmp/draftsmith-bench.lock python scripts/bench_draft_weights.py \
        [--target qwen2.5-coder-1.5b-instruct] [--draft qwen2.5-coder-0.5b-instruct] \
        [--dtype bfloat16] [--repeats 15] [--context 160]

What evaluate.draft_weights buys on the machine at hand: the draft loaded once per form
(as loaded, int8, int4: draftsmith/quant_draft.py, each with the input widths its own
timing chose), its 1-token cached forward on a --context-token KV cache timed interleaved
with the others and with the target's own 1-token step (draftsmith/clock.py: every repeat
runs every step once, the order rotated; medians), reported as milliseconds, as each form's
speed over the as-loaded draft, and as c, the draft step over the target step. The target
takes the one-row form the evaluate stage would time fastest (fast_linear.choose_linear_forms at
width 1), so c is over the target at its fastest, as the stage's baseline is; the
as-loaded draft takes the same form, as in the engine.
Acceptance is not here: `scripts/estimate_acceptance.py RUN CKPT --draft-weights int8 int4`
pairs the rounded drafts against the draft as loaded.
"""

from __future__ import annotations

import argparse
import copy

import torch

from draftsmith.clock import cached_forward, interleaved, quartiles
from draftsmith.evaluate.timing import causal_lm_draft_step
from draftsmith.fast_linear import choose_linear_forms, cpu_few_row_linear
from draftsmith.models import load_model
from draftsmith.quant_draft import quantize_draft

FORMS = ("as_loaded", "int8", "int4")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=160)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cpu, dtype = torch.device("cpu"), getattr(torch, args.dtype)

    target = load_model(args.target, device=cpu, dtype=dtype, key="--target")
    vocab = target.config.get_text_config().vocab_size
    context = [t % vocab for t in range(1000, 1000 + args.context)]
    forms = choose_linear_forms(target, context, [1], repeats=5)["forms"]
    drafts = {"as_loaded": load_model(args.draft, device=cpu, dtype=dtype, key="--draft")}
    for weights in FORMS[1:]:
        drafts[weights] = copy.deepcopy(drafts["as_loaded"])
        info = quantize_draft(drafts[weights], weights, target)
        print(f"{weights}: {info['layers']} layers, kernel at widths {info['kernel_widths']}")

    steps = {"target": cached_forward(target, context, context[:1])}
    # each draft's step as the engine takes it (draftsmith/decode_step.py)
    steps |= {f"draft {w}": causal_lm_draft_step(d, context, context[0]) for w, d in drafts.items()}
    # the as-loaded draft takes the target's one-row choice, as in the engine (the rounded
    # drafts' layers are not nn.Linear: their own kernels)
    with torch.inference_mode(), cpu_few_row_linear(target, drafts["as_loaded"], enabled=forms):
        times = interleaved(steps, args.repeats)

    ms = {name: 1e3 * quartiles(ts)[1] for name, ts in times.items()}
    one_row = forms.get("1", "F.linear")
    print(f"\ntarget {args.target} ({args.dtype}, one row {one_row}): {ms['target']:.1f} ms a step")
    loaded = times["draft as_loaded"]
    for w in FORMS:
        ts = times[f"draft {w}"]
        # per repeat, paired: each form against the as-loaded draft and the target
        speed = quartiles([a / b for a, b in zip(loaded, ts)])
        c = quartiles([d / t for d, t in zip(ts, times["target"])])
        print(
            f"draft {w:9s} {ms[f'draft {w}']:6.1f} ms a step  {speed[1]:.2f}x as loaded "
            f"(IQR {speed[0]:.2f}-{speed[2]:.2f})  c {c[1]:.3f} (IQR {c[0]:.3f}-{c[2]:.3f})"
        )


if __name__ == "__main__":
    main()
