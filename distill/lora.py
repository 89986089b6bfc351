"""Low-rank adapters (LoRA, Hu et al. 2021) for fine-tuning a pretrained draft cheaply.

distill.lora_rank = r wraps every attention and MLP projection of the draft's decoder
layers (the last distill.train_layers of them, when set): W x becomes W x + s B A x with
A (r, in), B (out, r), s = lora_alpha / r. W, the embeddings and the head stay frozen;
only A and B train (B starts at zero, so step 0 is the pretrained draft). The backward
pass still runs through every adapted layer, but skips the weight gradients of W and
the optimizer state for it.

A checkpoint stays a plain HF model dir: its weights are the merged W + s B A
(`merged_state_dict`), loadable anywhere without this module. The adapters themselves go
beside them (LORA_FILE) so that training resumes exactly: the base weights are the
init's (checkpoint-0), which LoRA never changes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

LORA_FILE = "lora_adapters.safetensors"
# the projections of a Llama/Qwen2-family decoder layer
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraLinear(nn.Module):
    """base(x) + scale * x A^T B^T, with the base layer frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base.requires_grad_(False)
        w = base.weight
        self.lora_a = nn.Parameter(
            torch.empty(rank, base.in_features, dtype=w.dtype, device=w.device)
        )
        self.lora_b = nn.Parameter(
            torch.zeros(base.out_features, rank, dtype=w.dtype, device=w.device)
        )
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as nn.Linear initialises
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T) @ self.lora_b.T * self.scale

    def merged_weight(self) -> torch.Tensor:
        return self.base.weight + self.scale * (self.lora_b @ self.lora_a).to(self.base.weight)


def add_lora(model, layers, rank: int, alpha: float) -> list[nn.Parameter]:
    """Wrap the projections of `layers` (modules of `model`) in LoraLinear; freeze every
    other parameter of the model. Returns the adapters' parameters."""
    model.requires_grad_(False)
    params = []
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if name in TARGET_MODULES and isinstance(child, nn.Linear):
                    wrapped = LoraLinear(child, rank, alpha)
                    setattr(parent, name, wrapped)
                    params += [wrapped.lora_a, wrapped.lora_b]
    return params


def _lora_modules(model) -> dict[str, LoraLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's state dict with every adapter merged into its base weight, under the
    plain model's key names: what an HF model dir without adapters holds."""
    wrapped = _lora_modules(model)
    out = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            owner, sep, leaf = key.rpartition(".base.")
            if key.endswith((".lora_a", ".lora_b")):
                continue
            if not sep or owner not in wrapped:
                out[key] = value
            else:  # the base layer's weight (merged) or bias, under the plain name
                out[f"{owner}.{leaf}"] = (
                    wrapped[owner].merged_weight() if leaf == "weight" else value
                )
    return out


def lora_state_dict(model) -> dict[str, torch.Tensor]:
    """Only the adapters: {module.lora_a, module.lora_b, ...}."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if ".lora_" in k}


def load_lora_state(model, state: dict[str, torch.Tensor]) -> None:
    missing = set(lora_state_dict(model)) ^ set(state)
    if missing:
        raise ValueError(f"adapter keys differ from the model's: {sorted(missing)[:3]}")
    model.load_state_dict(state, strict=False)
