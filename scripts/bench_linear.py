"""Few-row matmuls on CPU: F.linear (the peer) vs draftsmith.fast_linear, side by side.

    flock /tmp/draftsmith-bench.lock python scripts/bench_linear.py [--rows 1 2 3 4 5 8 16 64]

Two measurements on SmolLM2-135M-Instruct (registry smollm2-135m-instruct):
1. its 30 layers' projection shapes with random weights (~360 MB, more than the caches, so
   every pass streams the weights from memory as decoding does) plus the 49k x 576 head,
   ms per pass at each row count;
2. the real target's forward over T new tokens on a 120-token KV cache (a verify pass is
   T = k + 1), with F.linear and inside cpu_few_row_linear(model), and the ratio to T = 1.
Also checks that both give the same argmax tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from draftsmith.config import TargetConfig
from draftsmith.fast_linear import cpu_few_row_linear, few_row_linear
from draftsmith.kv_cache import cache_kwarg, new_cache
from draftsmith.models import load_target


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def layer_weights(cfg) -> list[torch.Tensor]:
    """(out, in) of every projection in the model, random values, plus the LM head."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    ws = [torch.randn(*s) for _ in range(cfg.num_hidden_layers) for s in shapes]
    return ws + [torch.randn(cfg.vocab_size, h)]


def bench_matmuls(cfg, rows: list[int], reps: int) -> None:
    ws = layer_weights(cfg)
    print(f"1. all projections + head, random weights ({len(ws)} matrices), ms per pass")
    print(f"{'rows':>5} {'F.linear':>9} {'W @ x^T':>9} {'ratio':>6}")
    for m in rows:
        xs = {d: torch.randn(m, d) for d in {w.shape[1] for w in ws}}
        peer = median_ms(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in ws], reps)
        ours = median_ms(lambda xs=xs: [few_row_linear(xs[w.shape[1]], w) for w in ws], reps)
        print(f"{m:>5} {peer:>9.1f} {ours:>9.1f} {peer / ours:>5.2f}x")


@torch.inference_mode()
def bench_forward(model, tokens: list[int], reps: int) -> None:
    kw = cache_kwarg(model)
    cache = new_cache(model)
    model(input_ids=torch.randint(0, 40000, (1, 120)), use_cache=True, **{kw: cache})

    def forward(t: int):
        ids = torch.randint(0, 40000, (1, t))
        out = model(input_ids=ids, use_cache=True, logits_to_keep=t, **{kw: cache}).logits
        cache.crop(-t)
        return out

    print(
        "\n2. target forward over T new tokens (120 cached), ms; ratio to T=1 (the verify cost v)"
    )
    print(f"{'T':>3} {'F.linear':>9} {'v':>5} {'few-row':>9} {'v':>5}")
    base = {}
    for t in tokens:
        peer = median_ms(lambda t=t: forward(t), reps)
        with cpu_few_row_linear(model):
            ours = median_ms(lambda t=t: forward(t), reps)
        base.setdefault("peer", peer)
        base.setdefault("ours", ours)
        print(
            f"{t:>3} {peer:>9.1f} {peer / base['peer']:>5.2f} {ours:>9.1f} {ours / base['ours']:>5.2f}"
        )
    ids = torch.randint(0, 40000, (1, 125))
    ref = model(input_ids=ids).logits.argmax(-1)
    with cpu_few_row_linear(model):
        got = model(input_ids=ids[:, :64]).logits.argmax(-1)
    assert torch.equal(got, ref[:, :64]), "few-row linear changed argmax tokens"
    print("argmax tokens identical")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 16, 64])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8])
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target_cfg = TargetConfig(model="smollm2-135m-instruct")
    model = load_target(target_cfg, torch.device("cpu"), torch.float32)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench_matmuls(model.config, args.rows, args.reps)
    bench_forward(model, args.tokens, args.reps)


if __name__ == "__main__":
    main()
