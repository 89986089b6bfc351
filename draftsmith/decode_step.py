"""A draft's decode step written out for Llama-family models: the same arithmetic as the
transformers forward, without its per-step bookkeeping.

A draft's step is the cost speculative decoding pays per drafted token, and on CPU the
0.5B draft's step in int4 weights spent only about 60% of its time in the matmuls when it
ran through the transformers forward (`scripts/bench_draft_step.py`, README "The draft's
step, written out"). The rest is the forward's generality: mask building, output
dataclasses, per-layer hooks and kwargs, the quantized layers' no-op casts. For the
decoders the pair and the quick config use (Llama: SmolLM2; Qwen2: Qwen2.5-Coder) this
module runs the step as a plain loop over the layers, calling the model's own modules for
embeddings, norms, rotary tables and activations, the quantized layers' forwards without
the module dispatch, and torch's scaled_dot_product_attention over the same KV cache the
forward fills. On this CPU it took the int4 0.5B's step to 0.85-0.87 of the forward's time,
with logits bit-identical to the forward's.

Scope and safety:
- only drafts: the target always runs the transformers forward, so its logits (which
  define the output) never depend on this code;
- only model classes in SUPPORTED with full attention everywhere and SiLU MLPs; anything
  else decodes through the forward;
- before a model's first fast step, `decode_step` checks it against the forward on a short
  context (two cached steps, one of two tokens and one of one); if the logits differ
  beyond float rounding it warns once and keeps that model on the forward.
The engine's draft steps and the evaluate stage's timing of them (evaluate/timing.py) both
go through `decode_logits`, so the cost the k recommendation uses is that of the step the
engine takes.
"""

from __future__ import annotations

import warnings
import weakref

import torch
import torch.nn.functional as F

from draftsmith.kv_cache import cache_kwarg, new_cache
from draftsmith.quant_draft import QuantWeightLinear

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
CHECK_CONTEXT = 6  # tokens of the self-check's context

# model -> its FastStep, or None where the model decodes through the forward
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unsupported_reason(model) -> str | None:
    """Why `model` cannot take the fast step, or None when it can."""
    name = type(model).__name__
    if name not in SUPPORTED:
        return f"{name} is not one of {', '.join(SUPPORTED)}"
    cfg = model.config.get_text_config()
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _linear(layer, x: torch.Tensor) -> torch.Tensor:
    """layer(x); a quantized layer (draftsmith's own, no hooks) through its forward directly,
    without the module call's dispatch."""
    return layer.forward(x) if isinstance(layer, QuantWeightLinear) else layer(x)


class FastStep:
    """The decode step of one Llama-family causal LM: ids (1, q) on top of `cache` -> the
    last position's logits (V,), the cache extended by q positions, as the forward does."""

    def __init__(self, model):
        cfg = model.config.get_text_config()
        self.model, self.inner = model, model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        # looked up once: a model whose modules are replaced gets a new step (_stale)
        self.layers, self.head = self._layers(), model.lm_head

    def _layers(self) -> list[tuple]:
        """Each decoder layer's modules in the order the step calls them, looked up once."""
        return [
            (
                layer.input_layernorm,
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
                layer.self_attn.o_proj,
                layer.post_attention_layernorm,
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
                layer.mlp.down_proj,
                layer.mlp.act_fn,
            )
            for layer in self.inner.layers
        ]

    def __call__(self, ids: torch.Tensor, cache) -> torch.Tensor:
        inner, h, g, d = self.inner, self.heads, self.kv_heads, self.head_dim
        q_len, past = ids.shape[1], cache.get_seq_length()
        x = inner.embed_tokens(ids)  # (1, q, hidden)
        positions = torch.arange(past, past + q_len, device=ids.device)[None]  # (1, q)
        cos, sin = inner.rotary_emb(x, positions)  # (1, q, D) each
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, q, D): broadcast over heads
        # q = 1 sees every cached position; q > 1 is causal within the new tokens
        mask = None
        if q_len > 1:
            rows = torch.arange(q_len, device=ids.device)[:, None]
            mask = torch.arange(past + q_len, device=ids.device)[None] <= past + rows  # (q, L)
        for i, (norm1, qp, kp, vp, op, norm2, gp, up, dp, act) in enumerate(self.layers):
            hs = norm1(x)
            qs = _linear(qp, hs).view(1, q_len, h, d).transpose(1, 2)  # (1, H, q, D)
            ks = _linear(kp, hs).view(1, q_len, g, d).transpose(1, 2)  # (1, G, q, D)
            vs = _linear(vp, hs).view(1, q_len, g, d).transpose(1, 2)
            qs = qs * cos + _rotate_half(qs) * sin
            ks = ks * cos + _rotate_half(ks) * sin
            keys, values = cache.update(ks, vs, i)  # (1, G, L, D) each, L = past + q
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, enable_gqa=True)
            o = o.transpose(1, 2).reshape(1, q_len, h * d)  # (1, q, H*D)
            x = x + _linear(op, o)
            hs = norm2(x)
            x = x + _linear(dp, act(_linear(gp, hs)) * _linear(up, hs))
        last = inner.norm(x[:, -1:])  # (1, 1, hidden)
        return _linear(self.head, last)[0, -1]  # (V,)


def _forward_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
    return out.logits[0, -1]  # (V,)


def _agrees(model, step: FastStep) -> tuple[bool, float]:
    """The fast step against the forward from one prefilled context, a 2-token step then a
    1-token one -> (within float rounding, the largest gap relative to the logits' scale)."""
    device = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    context = torch.arange(1, CHECK_CONTEXT + 1, device=device)[None] % vocab  # (1, C)
    caches = [new_cache(model), new_cache(model)]
    for cache in caches:
        _forward_logits(model, context[:, :-3], cache)
    worst = 0.0
    for feed in (context[:, -3:-1], context[:, -1:]):
        ref = _forward_logits(model, feed, caches[0]).float()
        got = step(feed, caches[1]).float()
        worst = max(worst, ((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item())
    return worst <= tolerance(model), worst


def tolerance(model) -> float:
    """The largest difference from the forward, relative to the logits' scale, that float
    rounding explains: 1e-4 in fp32; 2e-2 where activations pass through bf16 (a bf16
    model, or quantized layers, whose kernels take bf16 rows), since one different
    rounding of an activation moves everything after it by a bf16 step."""
    bf16 = next(model.parameters()).dtype != torch.float32 or any(
        isinstance(m, QuantWeightLinear) for m in model.modules()
    )
    return 2e-2 if bf16 else 1e-4


def _stale(model, step: FastStep | None) -> bool:
    """The model's modules were replaced since its step was made (quantize_draft replaces
    every linear layer it can): the step would call the old ones."""
    if step is None:
        return False
    if step.head is not model.lm_head:
        return True
    return bool(step.layers) and step.layers[0][1] is not model.model.layers[0].self_attn.q_proj


def fast_step(model) -> FastStep | None:
    """`model`'s FastStep, made and checked on first use (and again when its layers were
    replaced); None where the model decodes through its forward (not supported, or the
    check found a difference: warned once)."""
    if model in _STEPS and not _stale(model, _STEPS[model]):
        return _STEPS[model]
    step = None
    if unsupported_reason(model) is None:
        step = FastStep(model)
        with torch.inference_mode():
            ok, gap = _agrees(model, step)
        if not ok:
            warnings.warn(
                f"{type(model).__name__}: the fast decode step's logits differ from the "
                f"forward's by {gap:.3g} of their scale; this draft decodes through the forward",
                stacklevel=2,
            )
            step = None
    _STEPS[model] = step
    return step


def decode_logits(model, ids: torch.Tensor, cache) -> torch.Tensor:
    """The last position's logits (V,) of `ids` (1, q) on top of `cache`, extending it: the
    fast step where the model takes it, else the transformers forward."""
    step = fast_step(model)
    return step(ids, cache) if step is not None else _forward_logits(model, ids, cache)
