"""Low-rank adapters: merged weights compute what the adapted model computes, only the
adapters train, checkpoints are plain HF dirs, and a resumed run ends where an
uninterrupted one does."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from test_distill_helpers import make_cfg, run_dir_with_data

from draftsmith.distill import list_checkpoints, lora
from draftsmith.distill.stage import run_distill


def _tiny_llama(seed: int = 0):
    from transformers import LlamaForCausalLM

    from draftsmith.models import tiny_llama_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(50, hidden_size=32, intermediate_size=64)).eval()


def test_merged_weights_compute_the_adapted_model():
    model = _tiny_llama()
    plain = copy.deepcopy(model)
    params = lora.add_lora(model, model.model.layers[2:], rank=4, alpha=8.0)
    assert len(params) == 2 * 7 * 2  # A and B for 7 projections in each of 2 layers
    assert all(p.requires_grad for p in params)
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)  # B = 0: nothing changed yet
        for p in params:
            p.add_(0.1 * torch.randn_like(p))
        adapted = model(ids).logits
        merged = lora.merged_state_dict(model)
        assert merged.keys() == plain.state_dict().keys()
        plain.load_state_dict(merged)
        assert torch.allclose(plain(ids).logits, adapted, atol=1e-5)
        assert not torch.allclose(adapted, _tiny_llama()(ids).logits, atol=1e-3)
    saved = lora.lora_state_dict(model)
    fresh = _tiny_llama()
    lora.add_lora(fresh, fresh.model.layers[2:], rank=4, alpha=8.0)
    lora.load_lora_state(fresh, saved)
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, adapted)


def test_lora_training_moves_only_the_projections_and_resumes_exactly(
    tmp_path, target_dir, data_dir, monkeypatch
):
    from transformers import AutoModelForCausalLM

    from draftsmith.distill import train as train_mod

    def train(out):
        cfg = make_cfg(out, target_dir, teacher="offline", max_steps=4, save_every=2)
        cfg.distill.lora_rank, cfg.distill.lr = 2, 1e-2
        run_distill(cfg)
        return out / "checkpoints"

    ref = train(run_dir_with_data(tmp_path / "ref", data_dir))
    before = load_file(ref / "checkpoint-0" / "model.safetensors")
    after = load_file(ref / "checkpoint-4" / "model.safetensors")
    assert before.keys() == after.keys()  # merged: the plain model's keys, no adapters
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.split(".")[-2] in lora.TARGET_MODULES for k in moved)
    assert (ref / "checkpoint-4" / lora.LORA_FILE).is_file()
    AutoModelForCausalLM.from_pretrained(ref / "checkpoint-4")  # plain transformers loads it

    def interrupt(tag):  # ctrl-c after step 3: checkpoint-2 is the newest on disk
        if tag == "step:3":
            raise KeyboardInterrupt

    out = run_dir_with_data(tmp_path / "split", data_dir)
    monkeypatch.setattr(train_mod, "kill_hook", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(out)
    monkeypatch.undo()
    assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [0, 2]
    resumed = train(out)  # continues from checkpoint-2: the init's weights + its adapters
    assert [s for s, _ in list_checkpoints(resumed)] == [0, 2, 4]
    again = load_file(resumed / "checkpoint-4" / "model.safetensors")
    for key in after:
        assert torch.equal(after[key], again[key]), key
