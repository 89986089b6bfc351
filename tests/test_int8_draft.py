"""Int8 draft weights (evaluate.draft_int8): the layer computes what its rounded weights say,
only the draft changes, and the decoder's output stays the target's own."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from draftsmith.config import config_from_dict
from draftsmith.errors import ConfigError
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.int8_draft import Int8WeightLinear, check_int8_available, int8_draft
from draftsmith.models import tiny_llama_config


def test_the_layer_multiplies_by_per_row_rounded_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=True)
    with torch.no_grad():
        lin.weight[3] *= 50  # one row far larger: a per-row scale keeps the others fine
    q = Int8WeightLinear(lin, {1, 2, 5, 10})
    w, deq = lin.weight.detach(), q.dequantized()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    # symmetric rounding to the nearest step (the scale itself is stored in bf16: 2^-8 relative)
    assert ((deq - w).abs() <= scale * (0.5 + 127 * 2**-8)).all()
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.abs().max() == 127
    x = torch.randn(2, 5, 96)  # (batch, rows, in): any leading shape
    want = torch.nn.functional.linear(x, deq, lin.bias.detach())
    int8_path = q(x)  # 10 rows: the int8 kernel
    q.int8_widths = set()
    float_path = q(x)  # the same rounded weights through F.linear
    for got in (int8_path, float_path):
        assert got.shape == (2, 5, 40) and got.dtype == x.dtype
        # activations go through bf16 on the int8 path: bf16 rounding, not int8 steps
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    assert not torch.equal(int8_path, float_path)  # two paths really ran
    # .weight, read by code that casts to a layer's dtype: the rounded floats, not the original
    assert q.weight.dtype == lin.weight.dtype and torch.equal(q.weight, deq.to(lin.weight.dtype))


def _tiny(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = tiny_llama_config(48, num_hidden_layers=2, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def test_int8_draft_replaces_every_linear_but_the_targets_own():
    target = _tiny(0)
    draft = _tiny(1)
    draft.lm_head = target.lm_head  # a head reading the target's module (as an EAGLE-3 head may)
    before = {n: p.clone() for n, p in target.named_parameters()}
    linears = sum(type(m) is torch.nn.Linear for m in draft.modules())
    info = int8_draft(draft, target)
    assert info["layers"] == linears - 1  # all but the shared lm_head
    assert set(info["ms"]) == set(range(1, 9)) and set(info["int8_widths"]) <= set(range(1, 9))
    assert type(draft.lm_head) is torch.nn.Linear and draft.lm_head is target.lm_head
    assert all(type(m) is not torch.nn.Linear for m in draft.model.modules())
    for name, p in target.named_parameters():  # the target is exactly as loaded
        assert torch.equal(p, before[name]), name


def test_speculative_output_with_an_int8_draft_is_the_targets_own():
    target = _tiny(2)
    draft = copy.deepcopy(target)  # a perfect draft, then rounded: it still proposes well
    info = int8_draft(draft, target)
    assert info["layers"] > 0
    prompt = [5, 9, 14, 3, 22]
    base = SpeculativeDecoder(target, eos_ids=set()).generate(prompt, 24)
    assert base.target_prefill_time > 0 and base.draft_prefill_time == 0  # no draft, no prefill
    for widths in (set(range(1, 9)), set()):  # every step int8, then none (timed choice aside)
        for m in draft.modules():
            if isinstance(m, Int8WeightLinear):
                m.int8_widths = widths
        spec = SpeculativeDecoder(target, draft, k=3, eos_ids=set()).generate(prompt, 24)
        assert spec.tokens == base.tokens
        assert spec.target_prefill_time > 0 and spec.draft_prefill_time > 0  # the request model's
        # the rounded perfect draft keeps proposing the target's tokens: most are accepted
        assert spec.accepted > spec.proposed // 2 and spec.target_forwards < len(spec.tokens)


def test_int8_off_cpu_or_with_vllm_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^evaluate\.draft_int8: .*device is cuda"):
        check_int8_available(torch.device("cuda"))
    with pytest.raises(ConfigError, match=r"^evaluate\.draft_int8: .*vLLM"):
        config_from_dict(
            {
                "run": {"output_dir": str(tmp_path)},
                "target": {"model": "x"},
                "evaluate": {"backend": "vllm", "draft_int8": True},
            }
        )
