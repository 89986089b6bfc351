"""Where a quantized draft's decode step goes: the transformers forward, the engine's fast
step, the matmuls alone, and a static-cache step run eagerly and compiled by inductor.

    flock /tmp/draftsmith-bench.lock python scripts/bench_draft_step.py \
        [--draft qwen2.5-coder-0.5b-instruct] [--weights int4] [--dtype bfloat16] \
        [--repeats 15] [--context 160] [--capacity 224] [--no-compile]

The draft is loaded and rounded as the evaluate stage decodes it (evaluate.draft_weights:
draftsmith/quant_draft.py). Five ways of taking one 1-token step on a --context-token
cache, timed interleaved (draftsmith/clock.py; medians), each as a share of the first:
- forward: the model's own transformers forward with draftsmith's KV cache (the engine's
  draft step until the fast step);
- fast step: draftsmith/decode_step.py, the engine's draft step (and the one the evaluate
  stage times): the same arithmetic as a plain loop over the layers, on the same cache;
- matmuls only: the step's quantized matmuls (every rounded layer once, one row each),
  back to back on random rows: what the step costs with nothing else in it, and the bytes
  it streams per millisecond;
- static, eager: the same step written out for a Llama-family decoder (RMSNorm, rotary,
  grouped-query attention, gated MLP: Llama, Qwen2, SmolLM2) over a preallocated cache of
  --capacity positions (default: the context + 64), attending over all of them with the
  unwritten ones masked, with no per-step mask building or cache bookkeeping;
- static, compiled: that function through torch.compile (inductor's fused CPU kernels); its
  compile time is printed apart.
The fast and static steps' logits are checked against the forward's (the script stops when
they differ beyond float rounding), so the figures time the same computation.

The README's "Quantized draft weights" section has the result on this machine kind.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from draftsmith.clock import cached_forward, interleaved, quartiles
from draftsmith.decode_step import fast_step
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate.timing import causal_lm_draft_step
from draftsmith.kv_cache import new_cache
from draftsmith.models import load_model
from draftsmith.quant_draft import LAYERS, QuantWeightLinear, quantize_draft


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return xf.to(x.dtype) * norm.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class StaticStep:
    """One decode step of a Llama-family causal LM over preallocated keys and values
    (layers, kv_heads, capacity, head_dim), the position a tensor: a function of fixed
    shapes, which torch.compile can trace whole."""

    def __init__(self, model, capacity: int):
        cfg = model.config.get_text_config()
        inner = model.model
        if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
            raise DraftsmithError(
                f"--draft: {type(model).__name__} is not a Llama-family decoder (embed_tokens, "
                "layers, norm, rotary_emb); the static step is written for those"
            )
        self.model, self.capacity = model, capacity
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        dtype = model.lm_head.weight.dtype
        with torch.no_grad():  # (capacity, head_dim) rotary tables, from the model's own rope
            positions = torch.arange(capacity)[None]
            cos, sin = inner.rotary_emb(torch.zeros(1, dtype=dtype), positions)
        self.cos, self.sin = cos[0], sin[0]
        shape = (len(inner.layers), self.kv_heads, capacity, self.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype)
        self.values = torch.zeros(shape, dtype=dtype)

    def load(self, cache) -> int:
        """Copy a prefilled draftsmith cache in -> the number of positions it holds."""
        n = cache.get_seq_length()
        for i, layer in enumerate(cache.layers):
            self.keys[i, :, :n] = layer.keys[0]
            self.values[i, :, :n] = layer.values[0]
        return n

    def __call__(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """token (1,), pos (1,) -> logits (V,); writes the token's keys/values at pos."""
        inner, h_, g_, d_ = self.model.model, self.heads, self.kv_heads, self.head_dim
        x = inner.embed_tokens(token)  # (1, d)
        cos, sin = self.cos[pos], self.sin[pos]  # (1, D)
        visible = torch.arange(self.capacity) <= pos  # (S,)
        for i, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms(x, layer.input_layernorm)
            q = attn.q_proj(h).view(h_, d_)
            k = attn.k_proj(h).view(g_, d_)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys[i].index_copy_(1, pos, k.unsqueeze(1))
            self.values[i].index_copy_(1, pos, attn.v_proj(h).view(g_, 1, d_))
            qg = q.view(g_, h_ // g_, d_).float()  # (groups, heads per group, D)
            scores = qg @ self.keys[i].float().transpose(1, 2) / d_**0.5  # (groups, hpg, S)
            weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            o = (weights @ self.values[i].float()).to(x.dtype).reshape(1, h_ * d_)
            x = x + attn.o_proj(o)
            h = _rms(x, layer.post_attention_layernorm)
            x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        return self.model.lm_head(_rms(x, inner.norm))[0]


def matmuls_only(layers: list[QuantWeightLinear]):
    """Every rounded layer's kernel once on a random row: the step's matmuls, nothing else."""
    rows = [torch.randn(1, m.in_features, dtype=torch.bfloat16) for m in layers]

    def run() -> None:
        for m, x in zip(layers, rows):
            m._kernel(x)

    return run, lambda: None


def kernel_bytes(layers: list[QuantWeightLinear]) -> int:
    """Bytes the kernels read per step: every buffer but the float copy kept for wide inputs."""
    return sum(
        b.numel() * b.element_size()
        for m in layers
        for name, b in m.named_buffers()
        if name != "weight_float" and b is not None
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--weights", default="int4", choices=list(LAYERS))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--capacity", type=int, default=None, help="static cache size")
    ap.add_argument("--no-compile", action="store_true", help="skip the inductor step")
    args = ap.parse_args()
    torch.set_num_threads(2)
    cpu, dtype = torch.device("cpu"), getattr(torch, args.dtype)

    draft = load_model(args.draft, device=cpu, dtype=dtype, key="--draft")
    info = quantize_draft(draft, args.weights)
    layers = [m for m in draft.modules() if isinstance(m, QuantWeightLinear)]
    print(f"{args.weights}: {info['layers']} layers, kernel at widths {info['kernel_widths']}")
    vocab = draft.config.get_text_config().vocab_size
    context = [t % vocab for t in range(1000, 1000 + args.context)]
    token, pos = torch.tensor([context[-1]]), torch.tensor([args.context - 1])

    capacity = args.capacity or args.context + 64
    if capacity < args.context:
        raise SystemExit(
            f"--capacity: {capacity} positions cannot hold a {args.context}-token context"
        )
    static = StaticStep(draft, capacity=capacity)
    with torch.inference_mode():
        cache = new_cache(draft)
        draft(input_ids=torch.tensor([context[:-1]]), use_cache=True, past_key_values=cache)
        static.load(cache)
        ref = draft(input_ids=token[None], use_cache=True, past_key_values=cache).logits[0, -1]
        check_same_step("static, eager", static(token, pos), ref)
        if fast_step(draft) is None:
            raise SystemExit(f"--draft: {type(draft).__name__} has no fast step")
        fast_cache = new_cache(draft)
        draft(input_ids=torch.tensor([context[:-1]]), use_cache=True, past_key_values=fast_cache)
        check_same_step("fast step", fast_step(draft)(token[None], fast_cache), ref)

    steps = {
        "forward": cached_forward(draft, context[:-1], context[-1:]),
        "fast step": causal_lm_draft_step(draft, context[:-1], context[-1]),
        "matmuls only": matmuls_only(layers),
        "static, eager": (lambda: static(token, pos), lambda: None),
    }
    if not args.no_compile:
        compiled = torch.compile(static.__call__, fullgraph=True, dynamic=False)
        start = time.perf_counter()
        with torch.inference_mode():
            check_same_step("static, compiled", compiled(token, pos), ref)
        print(f"inductor compile (first call): {time.perf_counter() - start:.1f} s")
        steps["static, compiled"] = (lambda: compiled(token, pos), lambda: None)
    with torch.inference_mode():
        times = interleaved(steps, args.repeats)

    forward = times["forward"]
    mb = kernel_bytes(layers) / 1e6
    print(f"\ndraft {args.draft} ({args.weights} weights, {mb:.0f} MB read by the kernels a step)")
    for name, ts in times.items():
        q = quartiles(ts)
        share = quartiles([t / f for t, f in zip(ts, forward)])
        print(
            f"  {name:17s} {1e3 * q[1]:6.1f} ms (IQR {1e3 * q[0]:.1f}-{1e3 * q[2]:.1f})  "
            f"{share[1]:.2f} of the forward  {mb / (1e3 * q[1]):.1f} GB/s of kernel bytes"
        )


def check_same_step(name: str, logits: torch.Tensor, ref: torch.Tensor) -> None:
    """Stop when a step's logits differ from the forward's by more than the rounding of sums
    taken in another order: 1e-4 of the largest logit in fp32, 2e-2 in bf16 (a step that
    skips a rotation or a norm misses by far more: tests/test_quant_draft.py)."""
    gap = (logits.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    if gap > (1e-4 if ref.dtype == torch.float32 else 2e-2) * scale:
        raise SystemExit(
            f"{name}: logits differ from the engine step's by {gap:.3g} (scale {scale:.3g})"
        )
    print(f"{name}: logits within {gap:.3g} of the forward's (scale {scale:.3g})")


if __name__ == "__main__":
    main()
