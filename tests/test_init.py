"""Draft initialisation: layer selection, from_target copies, fresh configs, FLOPs ratio."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from draftsmith.config import DraftConfig
from draftsmith.errors import ConfigError
from draftsmith.kinds.independent.init import (
    draft_from_config,
    draft_from_target,
    select_layers,
)
from draftsmith.models import flops_per_token, tiny_llama_config


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return LlamaForCausalLM(
        tiny_llama_config(50, hidden_size=32, intermediate_size=64, num_hidden_layers=6)
    ).eval()


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({"num_layers": 2, "layer_selection": "first"}, [0, 1]),
        ({"num_layers": 3, "layer_selection": "spread"}, [0, 2, 5]),  # round(2.5) = 2
        ({"num_layers": 2, "layer_selection": "spread"}, [0, 5]),
        ({"num_layers": 3, "layer_selection": "first_last"}, [0, 1, 5]),
        ({"num_layers": 1, "layer_selection": "first_last"}, [0]),
        ({"layers": [1, 4]}, [1, 4]),
    ],
)
def test_select_layers(kw, expected):
    assert select_layers(DraftConfig(**kw), 6) == expected


@pytest.mark.parametrize(
    "kw", [{"num_layers": 7}, {"layers": [0, 6]}, {"layers": [3, 1]}, {"layers": []}]
)
def test_select_layers_errors_name_the_key(kw):
    with pytest.raises(ConfigError, match="draft.(num_layers|layers)"):
        select_layers(DraftConfig(**kw), 6)


def test_from_target_copies_layers_and_kv_cache_works(target):
    draft = draft_from_target(target, [0, 5])
    assert draft.config.num_hidden_layers == 2 and len(draft.model.layers) == 2
    assert [layer.self_attn.layer_idx for layer in draft.model.layers] == [0, 1]
    torch.testing.assert_close(
        draft.model.layers[1].mlp.up_proj.weight, target.model.layers[5].mlp.up_proj.weight
    )
    torch.testing.assert_close(draft.model.norm.weight, target.model.norm.weight)
    assert (
        draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()
    )  # tied stays tied
    assert draft.model.embed_tokens.weight.data_ptr() != target.model.embed_tokens.weight.data_ptr()
    # incremental decoding with the KV cache gives the same logits as a full forward
    ids = torch.randint(0, 50, (1, 7))
    full = draft(ids).logits
    out = draft(ids[:, :4], use_cache=True)
    step = draft(ids[:, 4:], past_key_values=out.past_key_values, use_cache=True).logits
    torch.testing.assert_close(step, full[:, 4:], rtol=1e-4, atol=1e-5)
    # a from_target draft with all layers IS the target
    same = draft_from_target(target, list(range(6)))
    torch.testing.assert_close(same(ids).logits, target(ids).logits)


def test_from_config_sizes_and_embedding_copy(target):
    cfg = DraftConfig(init="config", num_hidden_layers=1, intermediate_size=48)
    draft = draft_from_config(target, cfg, seed=0)
    assert draft.config.num_hidden_layers == 1 and draft.config.intermediate_size == 48
    assert draft.config.hidden_size == 32  # None copies the target's
    torch.testing.assert_close(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)
    wide = draft_from_config(
        target,
        DraftConfig(init="config", hidden_size=48, num_attention_heads=4, num_key_value_heads=2),
        seed=0,
    )
    assert wide.model.embed_tokens.weight.shape == (50, 48)
    wide(torch.randint(0, 50, (1, 5)))  # head_dim follows the new width
    with pytest.raises(ConfigError, match="draft.hidden_size"):
        draft_from_config(
            target, DraftConfig(init="config", hidden_size=30, num_attention_heads=4), seed=0
        )


def test_flops_per_token_closed_form(target):
    c = target.config
    per_layer = sum(p.numel() for p in target.model.layers[0].parameters())
    expected = 2 * (6 * per_layer + c.hidden_size) + 2 * c.hidden_size * c.vocab_size
    assert flops_per_token(target) == expected
    draft = draft_from_target(target, [0, 1])
    assert (
        flops_per_token(draft)
        == 2 * (2 * per_layer + c.hidden_size) + 2 * c.hidden_size * c.vocab_size
    )
