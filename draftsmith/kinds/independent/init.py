"""The independent kind's initialisation (draft.init): pretrained, from_target (layer subset) or config.

All three return a draft that shares the target's vocabulary, in fp32 unless
draft.dtype says otherwise (mixed precision, not the weights, makes training
fast on GPUs). `from_target` and `config` need a Llama-family target
(`model.model.layers`, `model.model.embed_tokens`, `model.model.norm`).
"""

from __future__ import annotations

import copy

import torch

from draftsmith.config import Config, DraftConfig
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.models import (
    check_tokenizers_compatible,
    load_model,
    load_target_generation_config,
    load_tokenizer,
    resolve_model,
)
from draftsmith.vocab_rows import match_vocab_rows, token_id_count, vocab_rows


def select_layers(cfg: DraftConfig, num_target_layers: int) -> list[int]:
    """Indices of the target layers the draft keeps (sorted, distinct)."""
    n = num_target_layers
    if cfg.layers is not None:
        layers = list(cfg.layers)
        if not layers:
            raise ConfigError("draft.layers: must list at least one layer")
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise ConfigError(f"draft.layers: {bad} out of range for a {n}-layer target")
        if len(set(layers)) != len(layers) or layers != sorted(layers):
            raise ConfigError(f"draft.layers: must be distinct and increasing, got {layers}")
        return layers
    k = cfg.num_layers
    if k > n:
        raise ConfigError(f"draft.num_layers: {k} is more than the target's {n} layers")
    if cfg.layer_selection == "first":
        return list(range(k))
    if cfg.layer_selection == "first_last":
        if k == 1:
            return [0]
        return list(range(k - 1)) + [n - 1]
    # spread: evenly spaced, including the first and the last layer
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _layers_of(model):
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise DraftsmithError(
            f"draft.init: needs a Llama-family target (model.model.layers); "
            f"{type(model).__name__} has none (use draft.init=pretrained)"
        )
    return inner.layers


def draft_from_target(target, layers: list[int]):
    """A fresh model of the target's class with the chosen layers, embeddings, norm and head.

    Built from a config (not a deepcopy) so layer_idx of every attention module, and with
    it the KV cache, is numbered 0..len(layers)-1; tied embeddings stay tied.
    """
    _layers_of(target)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in layers]
    draft = type(target)(config)
    remap = {f"model.layers.{old}.": f"model.layers.{new}." for new, old in enumerate(layers)}
    state = {}
    for key, value in target.state_dict().items():
        if key.startswith("model.layers."):
            prefix = ".".join(key.split(".")[:3]) + "."
            if prefix not in remap:
                continue
            key = remap[prefix] + key[len(prefix) :]
        state[key] = value
    missing, unexpected = draft.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise DraftsmithError(
            f"draft.init: layer copy mismatch (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if config.tie_word_embeddings:
        draft.tie_weights()
    return draft


def draft_from_config(target, cfg: DraftConfig, seed: int):
    """A fresh, randomly initialised model of the target's family with the given sizes."""
    _layers_of(target)
    config = copy.deepcopy(target.config)
    for name in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
    ):
        value = getattr(cfg, name)
        if value is not None:
            setattr(config, name, value)
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(
            f"draft.hidden_size: {config.hidden_size} must be divisible by "
            f"draft.num_attention_heads ({config.num_attention_heads})"
        )
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(
            f"draft.num_key_value_heads: {config.num_key_value_heads} must divide "
            f"num_attention_heads ({config.num_attention_heads})"
        )
    if hasattr(config, "head_dim"):
        config.head_dim = config.hidden_size // config.num_attention_heads
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[0]] * config.num_hidden_layers
    torch.manual_seed(seed)
    draft = type(target)(config)
    # Reuse the target's token embeddings (and untied head) when the shapes allow it.
    with torch.no_grad():
        src, dst = target.get_input_embeddings().weight, draft.get_input_embeddings().weight
        if src.shape == dst.shape:
            dst.copy_(src)
        if not config.tie_word_embeddings:
            src, dst = target.get_output_embeddings().weight, draft.get_output_embeddings().weight
            if src.shape == dst.shape:
                dst.copy_(src)
    return draft


def check_pretrained_draft(cfg: Config, target_tok) -> None:
    """A pretrained draft's tokenizer against the target's, from files only (no weights).

    `draftsmith run` calls this (IndependentTraining.check_target) before generate writes
    anything, so a draft of another family fails in seconds instead of after the target has
    generated the training data.
    """
    if cfg.draft.init != "pretrained":
        return
    from transformers import AutoConfig

    tok = load_tokenizer(cfg.draft.model, key="draft.model")
    try:
        rows = AutoConfig.from_pretrained(resolve_model(cfg.draft.model, "draft.model"))
    except (OSError, ValueError) as e:
        raise DraftsmithError(
            f"draft.model: cannot load the config of {cfg.draft.model}: {str(e).splitlines()[0]}"
        ) from None
    check_tokenizers_compatible(
        target_tok, tok, cfg.target.model, cfg.draft.model, rows.get_text_config().vocab_size
    )


def build_draft(cfg: Config, target, target_tok, device: torch.device, target_config=None):
    """(draft model, draft tokenizer, description) per cfg.draft; the draft in train mode.

    `target` (the loaded model) is needed by from_target and config; a pretrained draft
    needs only the target's config (`target_config`, for its vocabulary rows) and reads
    the generation config from the target's files. Every draft leaves with the target's
    row count and its padding rows filled (draftsmith/vocab_rows.py), so the losses, the
    engine and vLLM's equal-vocabulary check all see one size.
    """
    dcfg = cfg.draft
    target_config = target_config if target_config is not None else target.config
    dtype = torch.float32 if dcfg.dtype == "auto" else getattr(torch, dcfg.dtype)
    if dcfg.init == "pretrained":
        draft = load_model(dcfg.model, device=device, dtype=dtype, key="draft.model")
        tok = load_tokenizer(dcfg.model, key="draft.model")
        check_tokenizers_compatible(
            target_tok, tok, cfg.target.model, dcfg.model, vocab_rows(draft)
        )
        desc = f"pretrained {resolve_model(dcfg.model, 'draft.model')}"
    elif dcfg.init == "from_target":
        layers = select_layers(dcfg, len(_layers_of(target)))
        draft = draft_from_target(target, layers)
        tok, desc = target_tok, f"from_target layers {layers}"
    else:
        draft = draft_from_config(target, dcfg, cfg.run.seed)
        tok, desc = target_tok, "config " + _size_text(draft.config)
    rows = target_config.get_text_config().vocab_size
    match_vocab_rows(draft, rows, token_id_count(target_tok), key="target.model")
    generation_config = _target_generation_config(cfg, target)
    if generation_config is not None:  # the target's EOS ids etc. travel with the draft
        draft.generation_config = generation_config
    return draft.to(device=device, dtype=dtype).train(), tok, desc


def _target_generation_config(cfg: Config, target):
    """The target's generation config: from the loaded model, else from its files (or None)."""
    if target is not None:
        return copy.deepcopy(target.generation_config)
    return load_target_generation_config(cfg.target)


def _size_text(c) -> str:
    return (
        f"hidden {c.hidden_size}, layers {c.num_hidden_layers}, heads {c.num_attention_heads}"
        f"/{c.num_key_value_heads}, ffn {c.intermediate_size}"
    )
