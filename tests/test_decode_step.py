"""The fast draft step (draftsmith/decode_step.py) gives the transformers forward's logits."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from draftsmith import decode_step
from draftsmith.decode_step import FastStep, decode_logits, fast_step, unsupported_reason
from draftsmith.kv_cache import crop_cache, new_cache
from draftsmith.quant_draft import quantize_draft

SHAPE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def _llama(**kw):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SHAPE, **kw)).eval()


def _qwen2(**kw):
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**SHAPE, **kw)).eval()  # q/k/v with biases


def _forward(model, ids, cache):
    return model(input_ids=ids, use_cache=True, past_key_values=cache).logits[0, -1]


def _decode_both(model, feeds, crop_to=None):
    """Feed each (1, q) chunk to two caches, one by the forward and one by the fast step
    -> [(forward logits, fast logits)] per chunk; `crop_to`: crop both before the last."""
    step = FastStep(model)
    ref_cache, fast_cache = new_cache(model), new_cache(model)
    prompt = torch.arange(3, 13)[None]  # (1, 10)
    _forward(model, prompt, ref_cache)
    _forward(model, prompt, fast_cache)
    out = []
    for j, ids in enumerate(feeds):
        if crop_to is not None and j == len(feeds) - 1:
            crop_cache(ref_cache, crop_to)
            crop_cache(fast_cache, crop_to)
        out.append((_forward(model, ids, ref_cache), step(ids, fast_cache)))
        assert fast_cache.get_seq_length() == ref_cache.get_seq_length()
    return out


FEEDS = [torch.tensor([[5, 9]]), torch.tensor([[7]]), torch.tensor([[11]]), torch.tensor([[2, 4]])]


@pytest.mark.parametrize("make", [_llama, _qwen2], ids=["llama", "qwen2"])
@torch.inference_mode()
def test_fast_step_equals_the_forward_at_one_and_two_tokens_and_after_a_crop(make):
    model = make()
    assert unsupported_reason(model) is None
    for ref, got in _decode_both(model, FEEDS, crop_to=11):  # the crop drops 3 positions
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_fast_step_equals_the_forward_with_int4_weights_at_kernel_and_float_widths():
    """Kernel widths go straight to the int4 kernel, others through the layer's float copy,
    the operations of the layer's own forward; its rows are rounded to bf16, so a different
    attention summation can move a logit by a bf16 step (decode_step.tolerance)."""
    model = _qwen2()
    quantize_draft(model, "int4", kernel_widths=[1])
    assert decode_step.tolerance(model) == 2e-2 and decode_step.tolerance(_qwen2()) == 1e-4
    for ref, got in _decode_both(model, FEEDS):
        assert (got - ref).abs().max() <= 2e-2 * ref.abs().max()
        assert (got - ref).abs().max() < 0.3 * (ref - ref.mean()).abs().max()  # not noise


@torch.inference_mode()
def test_the_step_is_checked_once_and_a_wrong_one_falls_back_to_the_forward(monkeypatch):
    model = _llama()
    step = fast_step(model)
    assert isinstance(step, FastStep) and fast_step(model) is step  # made once
    quantize_draft(model, "int4", kernel_widths=[1])
    assert fast_step(model) is not step  # its layers were replaced: made and checked again

    broken = _llama()
    real = FastStep.__call__
    monkeypatch.setattr(FastStep, "__call__", lambda self, ids, cache: real(self, ids, cache) + 1)
    with pytest.warns(
        UserWarning, match="differ from the forward's .* decodes through the forward"
    ):
        assert fast_step(broken) is None
    cache = new_cache(broken)
    ids = torch.tensor([[3, 4, 5]])
    ref = _forward(broken, ids, new_cache(broken))
    torch.testing.assert_close(decode_logits(broken, ids, cache), ref)  # the forward's


def test_models_the_step_does_not_cover_decode_through_the_forward():
    assert "sliding-window" in unsupported_reason(_qwen2(use_sliding_window=True, sliding_window=4))
    assert unsupported_reason(_llama(hidden_act="gelu")) == "hidden_act gelu"
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    assert "GPT2LMHeadModel is not one of" in unsupported_reason(gpt2)
    assert fast_step(gpt2) is None
    with torch.inference_mode():
        ids = torch.tensor([[1, 2, 3]])
        torch.testing.assert_close(
            decode_logits(gpt2, ids, new_cache(gpt2)), _forward(gpt2, ids, new_cache(gpt2))
        )
    assert decode_step._STEPS[gpt2] is None  # remembered: not asked again
