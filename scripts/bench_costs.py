"""Per-width forward costs of a target and its draft, in fp32 and bf16, in each linear form.

    flock /tmp/draftsmith-bench.lock python scripts/bench_costs.py \
        --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
        [--widths 1 2 3 4 5 7] [--repeats 7] [--context 160]

What speculative decoding costs on the machine at hand: a cached forward over q tokens
(q = 1 is a decode step or a draft step, q = k + 1 a verify pass) on a --context-token KV
cache, for each model, dtype (fp32, bf16) and form of the linear layers
(draftsmith/fast_linear.py: F.linear; W @ x^T for q > 1; packed weights, bf16 only). Each model and dtype is loaded once; its steps are
timed interleaved (draftsmith/clock.py: every repeat runs every step once, the order rotated)
and reported as medians, with each width's cost over the same dtype's 1-token forward (v)
and the draft's 1-token forward over the target's in each dtype pairing (c). Whether bf16
wins at one row, and which form wins at few rows, differ between CPUs of one kind: this
table is what target.dtype and evaluate.cpu_few_row_linear should be set from.
"""

from __future__ import annotations

import argparse
import gc

import torch

from draftsmith.clock import Step, cached_forward, interleaved, quartiles
from draftsmith.fast_linear import (
    F_LINEAR,
    FEW_ROW,
    PACKED,
    FormSwitch,
    cpu_few_row_linear,
    in_form,
)
from draftsmith.models import load_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def model_costs(ref: str, dtype: torch.dtype, widths: list[int], ctx: int, repeats: int) -> dict:
    """{(form, q): median ms} for one model in one dtype."""
    model = load_model(ref, device=torch.device("cpu"), dtype=dtype)
    vocab = model.config.get_text_config().vocab_size
    context = [t % vocab for t in range(1000, 1000 + ctx)]
    switch = FormSwitch()
    forms = [F_LINEAR, FEW_ROW] + ([PACKED] if dtype == torch.bfloat16 else [])
    steps: dict[str, Step] = {}
    for q in widths:
        step = cached_forward(model, context, context[:q])
        for form in forms if q > 1 else [f for f in forms if f != FEW_ROW]:
            steps[f"{form} {q}"] = in_form(step, switch, q, form)
    with torch.inference_mode(), cpu_few_row_linear(model, enabled=switch):
        times = interleaved(steps, repeats)
    del model
    gc.collect()
    return {tuple(name.split(" ")): 1e3 * quartiles(ts)[1] for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--widths", nargs="*", type=int, default=[1, 2, 3, 4, 5, 7])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--context", type=int, default=160)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ms = {}
    for role, ref in (("target", args.target), ("draft", args.draft)):
        for dname, dtype in DTYPES.items():
            ms[role, dname] = model_costs(ref, dtype, args.widths, args.context, args.repeats)
    print(
        f"ms per cached forward over q tokens ({args.context}-token cache), median of {args.repeats}"
    )
    header = "model   dtype form      " + "".join(f"{'q=' + str(q):>9}" for q in args.widths)
    print(header)
    for (role, dname), table in ms.items():
        for form in (F_LINEAR, FEW_ROW, PACKED):
            cells = [table.get((form, str(q))) for q in args.widths]
            row = "".join(f"{c:9.1f}" if c is not None else f"{'-':>9}" for c in cells)
            print(f"{role:7s} {dname:5s} {form:9s} {row}")
    print("\nverify cost v (best form at q / the same dtype's 1-token forward):")
    for (role, dname), table in ms.items():
        one = min(v for (f, q), v in table.items() if q == "1")
        best = [min(v for (f, q), v in table.items() if q == str(w)) / one for w in args.widths]
        print(f"  {role:7s} {dname:5s} " + " ".join(f"{v:5.2f}" for v in best))
    print("\ndraft cost c (1-token draft / 1-token target, each in its best form):")
    one = {r: min(v for (f, q), v in ms[r].items() if q == "1") for r in ms}
    for t in DTYPES:
        for d in DTYPES:
            c = one["draft", d] / one["target", t]
            print(f"  target {t}, draft {d}: c = {c:.3f}")


if __name__ == "__main__":
    main()
