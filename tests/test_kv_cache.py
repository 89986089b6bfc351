"""The in-place KV cache gives the same logits as transformers' DynamicCache under every
operation the engine and the generator use: prefill, decode, multi-token verify, crop
after a rejection, dropping finished rows, and growing past its first buffer."""

from __future__ import annotations

import torch
from transformers import DynamicCache, LlamaForCausalLM

from draftsmith.kv_cache import cache_kwarg, crop_cache, move_entry, new_cache
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


def test_a_moved_entry_reads_as_if_its_token_had_been_fed_there():
    """move_entry + crop (a tree verify's emitted leaf joining its prefix) on both caches:
    the next forward's logits equal those of a cache fed the kept tokens in order."""
    model = _model()
    kw = cache_kwarg(model)
    prefix, branch = [5, 8, 13, 2], [40, 41, 42]  # the cache takes prefix + branch ...
    leaf = 77  # ... and a leaf standing in for branch[1], at its position

    def fed(tokens, cache, **extra):
        return model(input_ids=torch.tensor([tokens]), use_cache=True, **{kw: cache}, **extra)

    with torch.no_grad():
        want = fed([*prefix, branch[0], leaf, 9], new_cache(model)).logits[0, -1]
        for cache in (new_cache(model), DynamicCache(config=model.config)):
            fed(prefix + branch, cache)
            n = len(prefix)
            # the leaf sees the prefix, branch[0] and itself, at branch[1]'s position
            mask = torch.ones(1, 1, 1, n + 4, dtype=torch.bool)
            mask[..., n + 1 : n + 3] = False
            fed([leaf], cache, attention_mask=mask, position_ids=torch.tensor([[n + 1]]))
            move_entry(cache, n + 3, n + 1)
            crop_cache(cache, n + 2)
            got = fed([9], cache).logits[0, -1]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
