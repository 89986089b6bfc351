"""A KV cache that grows in place: preallocated buffers instead of a torch.cat per token.

transformers' DynamicCache concatenates every layer's keys and values with the new
token's at each forward, so decoding copies the whole cache once per token: at batch
32 that copy was a quarter of generate's CPU time (profiled on SmolLM2-135M). This cache
keeps one buffer per layer with room to spare (capacity doubles when full) and hands the
attention a view of the filled part, so a decode step writes only the new token.

It is a drop-in `Cache`: the engine's crop (speculative rejections) and the generator's
batch_select_indices (dropping finished rows) work on it as on a DynamicCache. Models
whose config has sliding-window or other non-full-attention layers get a plain
DynamicCache instead.
"""

from __future__ import annotations

import inspect

import torch


def cache_kwarg(model) -> str:
    """transformers 5.x names the forward's KV cache argument `cache`; 4.x `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _layer_class():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """One layer's keys/values (B, H, capacity, D), of which the first `length` are filled."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor):
            self.device = key_states.device
            self.length = 0
            self._k = self._v = None
            self.keys = key_states[..., :0, :]
            self.values = value_states[..., :0, :]
            self.is_initialized = True

        def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int):
            capacity = max(need, 2 * (0 if self._k is None else self._k.shape[-2]), 64)
            k_shape = (*key_states.shape[:-2], capacity, key_states.shape[-1])
            v_shape = (*value_states.shape[:-2], capacity, value_states.shape[-1])
            k = key_states.new_empty(k_shape)
            v = value_states.new_empty(v_shape)
            if self.length:
                k[..., : self.length, :] = self._k[..., : self.length, :]
                v[..., : self.length, :] = self._v[..., : self.length, :]
            self._k, self._v = k, v

        def _views(self) -> None:
            self.keys = self._k[..., : self.length, :]
            self.values = self._v[..., : self.length, :]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if self._k is None or end > self._k.shape[-2]:
                self._reserve(key_states, value_states, end)
            self._k[..., self.length : end, :] = key_states
            self._v[..., self.length : end, :] = value_states
            self.length = end
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length if self.is_initialized else 0

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative count of tokens to remove")
            if tokens_to_remove == 0 or not self.is_initialized:
                return
            self.length = max(0, self.length + tokens_to_remove)
            if self._k is not None:
                self._views()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self._k is not None:
                self._k, self._v = self._k[indices], self._v[indices]
                self._views()

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx.to(self.device))

        def reset(self) -> None:
            self.length = 0
            self._k = self._v = None
            self.keys = self.values = None
            self.is_initialized = False

    return GrowingLayer


_GROWING_LAYER = None


def crop_cache(cache, keep: int) -> None:
    """Cut `cache` back to its first `keep` tokens (no-op when it holds no more)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)  # a negative crop removes tokens in transformers 4.x and 5.x


def move_entry(cache, src: int, dst: int) -> None:
    """Copy every layer's keys and values at position `src` to `dst` (dst < src): a verify
    pass's emitted leaf joins its prefix before the cache is cropped behind it."""
    for layer in cache.layers:
        layer.keys[..., dst, :] = layer.keys[..., src, :]
        layer.values[..., dst, :] = layer.values[..., src, :]


def new_cache(model):
    """An empty KV cache for `model`: growing in place where every layer is full attention."""
    from transformers import DynamicCache
    from transformers.cache_utils import Cache

    global _GROWING_LAYER
    config = model.config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "sliding_window", None):
        return DynamicCache(config=model.config)
    if _GROWING_LAYER is None:
        _GROWING_LAYER = _layer_class()
    return Cache(layers=[_GROWING_LAYER() for _ in range(config.num_hidden_layers)])
