"""A run's export, served by plain transformers as an assistant model: same tokens as the target.

    python scripts/check_export.py RUN_DIR [--prompts 4] [--max-new-tokens 64] [--dtype float32]

Loads the target (the run's target.model) and RUN_DIR/export with nothing but
`AutoModelForCausalLM.from_pretrained`, decodes the first --prompts prompts of each of the
run's eval sets greedily with `target.generate(...)` and with
`target.generate(..., assistant_model=draft)` (the export's generation_config.json sets the
round size), and checks the two outputs are equal token for token. Prints tokens/s of both
and the assisted speedup (transformers' own loop, not draftsmith's engine). Exits 1 on any
difference. fp32 by default: in bf16 a multi-token verify pass and a 1-token step may round
a near-tie differently.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from draftsmith.config import load_config
from draftsmith.evaluate.prompts import eval_sets, load_prompts
from draftsmith.models import resolve_model


def main() -> int:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--prompts", type=int, default=4, help="per eval set")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(args.run_dir / "config.yaml")
    dtype = getattr(torch, args.dtype)
    target_dir = resolve_model(cfg.target.model, "target.model")
    export = args.run_dir / "export"
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(export, dtype=dtype).eval()
    gc = draft.generation_config
    print(
        f"target {target_dir}\nassistant {export} ({gc.num_assistant_tokens} tokens a round, "
        f"schedule {gc.num_assistant_tokens_schedule}), {args.dtype}, greedy"
    )
    sets = eval_sets(load_prompts(args.run_dir), args.prompts)
    plain_s = assisted_s = 0.0
    tokens, bad = 0, []
    for name, prompts in sets.items():
        for p in prompts:
            ids = torch.tensor([p["prompt_ids"]])
            kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
            with torch.inference_mode():
                start = time.perf_counter()
                plain = target.generate(ids, **kw)[0, ids.shape[1] :].tolist()
                plain_s += time.perf_counter() - start
                start = time.perf_counter()
                assisted = target.generate(ids, assistant_model=draft, **kw)[0, ids.shape[1] :]
                assisted_s += time.perf_counter() - start
            tokens += len(plain)
            same = assisted.tolist() == plain
            print(f"  {name} {p['id']}: {len(plain)} tokens, {'same' if same else 'DIFFERENT'}")
            if not same:
                bad.append(f"{name}/{p['id']}")
    print(
        f"{tokens} tokens: target alone {tokens / plain_s:.2f} tokens/s, assisted "
        f"{tokens / assisted_s:.2f} tokens/s ({plain_s / assisted_s:.2f}x)"
    )
    if bad:
        print(f"assisted output differs from the target's on {len(bad)} prompts: {bad}")
        return 1
    print("assisted output equals the target's on every prompt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
