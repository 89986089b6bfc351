"""The in-place KV cache gives the same logits as transformers' DynamicCache under every
operation the engine and the generator use: prefill, decode, multi-token verify, crop
after a rejection, dropping finished rows, and growing past its first buffer."""

from __future__ import annotations

import torch
from transformers import DynamicCache, LlamaForCausalLM

from draftsmith.kv_cache import cache_kwarg, new_cache
from draftsmith.models import tiny_llama_config


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config(97, num_hidden_layers=2)).eval()


def _script(model, cache) -> list[torch.Tensor]:
    """A fixed sequence of cache operations; returns every forward's logits."""
    kw = cache_kwarg(model)
    g = torch.Generator().manual_seed(1)
    outs = []

    def step(ids):
        out = model(input_ids=ids, use_cache=True, **{kw: cache}).logits
        outs.append(out)

    with torch.no_grad():
        step(torch.randint(0, 97, (3, 50), generator=g))  # prefill, 3 rows
        for _ in range(20):  # decode past the first 64-slot buffer
            step(torch.randint(0, 97, (3, 1), generator=g))
        step(torch.randint(0, 97, (3, 5), generator=g))  # a 5-token verify ...
        cache.crop(-3)  # ... of which 3 tokens are rejected
        step(torch.randint(0, 97, (3, 2), generator=g))
        cache.batch_select_indices(torch.tensor([0, 2]))  # row 1 finished
        for _ in range(3):
            step(torch.randint(0, 97, (2, 1), generator=g))
    assert cache.get_seq_length() == 50 + 20 + 5 - 3 + 2 + 3
    return outs


def test_growing_cache_matches_dynamic_cache():
    model = _model()
    ours = _script(model, new_cache(model))
    ref = _script(model, DynamicCache(config=model.config))
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_sliding_window_models_get_a_dynamic_cache():
    model = _model()
    model.config.sliding_window = 16
    assert isinstance(new_cache(model), DynamicCache)
