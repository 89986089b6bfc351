"""Quantized draft weights (evaluate.draft_weights: int8 | int4): each layer computes what its
rounded weights say, on the kernel path and the float path alike, only the draft changes, and
the decoder's output stays the target's own."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from draftsmith.config import config_from_dict
from draftsmith.errors import ConfigError
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.models import tiny_llama_config
from draftsmith.quant_draft import (
    INT4_GROUP,
    Int4WeightLinear,
    Int8WeightLinear,
    QuantWeightLinear,
    check_quant_available,
    quantize_draft,
)

WEIGHTS = ["int8", "int4"]


def _both_paths(q: QuantWeightLinear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output through its quantized kernel, then through F.linear."""
    q.kernel_widths = {x.numel() // q.in_features}
    kernel = q(x)
    q.kernel_widths = set()
    return kernel, q(x)


def _check_paths(q: QuantWeightLinear, lin: torch.nn.Linear) -> None:
    x = torch.randn(2, 5, lin.in_features)  # (batch, rows, in): any leading shape
    want = torch.nn.functional.linear(x, q.dequantized(), lin.bias.detach())
    kernel, float_path = _both_paths(q, x)
    for got in (kernel, float_path):
        assert got.shape == (2, 5, lin.out_features) and got.dtype == x.dtype
        # activations go through bf16 on the kernel path: bf16 rounding, not quantization steps
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    assert not torch.equal(kernel, float_path)  # two paths really ran
    # .weight, read by code that casts to a layer's dtype: the rounded floats, not the original
    assert q.weight.dtype == lin.weight.dtype and torch.equal(q.weight.float(), q.dequantized())


def test_int8_multiplies_by_per_row_rounded_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=True)
    with torch.no_grad():
        lin.weight[3] *= 50  # one row far larger: a per-row scale keeps the others fine
    q = Int8WeightLinear(lin, set())
    w, deq = lin.weight.detach(), q.dequantized()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    # symmetric rounding to the nearest step (the scale itself is stored in bf16: 2^-8 relative)
    assert ((deq - w).abs() <= scale * (0.5 + 127 * 2**-8)).all()
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.abs().max() == 127
    _check_paths(q, lin)


def test_int4_multiplies_by_per_group_rounded_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 48, bias=True)
    with torch.no_grad():
        lin.weight[3, :INT4_GROUP] *= 50  # one group far larger: the other groups keep their step
    q = Int4WeightLinear(lin, set())
    w, deq = lin.weight.detach(), q.dequantized()
    groups = w.reshape(48, -1, INT4_GROUP)
    step = (groups.amax(-1) - groups.amin(-1)) / 15  # (out, groups): 16 levels per group
    err = (deq - w).abs().reshape(48, -1, INT4_GROUP)
    # nearest of 16 levels from the group's minimum; step and offset stored in bf16 (2^-8
    # relative each, the offset's error up to the group's largest magnitude)
    big = groups.abs().amax(-1)
    bound = step * (0.5 + 16 * 2**-8) + big * 2**-8
    assert (err <= bound[..., None]).all()
    assert (err[3, 1:] < step[3, 0] / 40).all()  # the large group's step stays its own
    # about 4 bits: the error is far above int8's and far below the weights
    rel = ((deq - w).norm() / w.norm()).item()
    assert 0.01 < rel < 0.2
    assert q.packed.dtype == torch.uint8 and q.packed.numel() * 2 <= w.numel() + 64
    _check_paths(q, lin)


def _tiny(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = tiny_llama_config(48, num_hidden_layers=2, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("weights", WEIGHTS)
def test_quantize_draft_replaces_every_linear_but_the_targets_own(weights):
    target = _tiny(0)
    draft = _tiny(1)
    draft.lm_head = target.lm_head  # a head reading the target's module (as an EAGLE-3 head may)
    before = {n: p.clone() for n, p in target.named_parameters()}
    linears = sum(type(m) is torch.nn.Linear for m in draft.modules())
    info = quantize_draft(draft, weights, target)
    assert info["weights"] == weights and info["layers"] == linears - 1  # all but the shared head
    assert set(info["ms"]) == set(range(1, 9)) and set(info["kernel_widths"]) <= set(range(1, 9))
    assert type(draft.lm_head) is torch.nn.Linear and draft.lm_head is target.lm_head
    assert all(type(m) is not torch.nn.Linear for m in draft.model.modules())
    assert all(
        m.bits == int(weights[3:]) for m in draft.modules() if isinstance(m, QuantWeightLinear)
    )
    for name, p in target.named_parameters():  # the target is exactly as loaded
        assert torch.equal(p, before[name]), name


def test_int4_leaves_layers_the_kernel_cannot_take():
    """The int4 kernel wants in_features in groups of 32 and out_features in blocks of 16:
    a layer without them stays float (and the rest are still rounded)."""
    draft = _tiny(1)
    draft.lm_head = torch.nn.Linear(64, 50, bias=False)  # 50 outputs: not a multiple of 16
    draft.model.layers[0].mlp.down_proj = torch.nn.Linear(120, 64, bias=False)  # 120 inputs
    linears = sum(type(m) is torch.nn.Linear for m in draft.modules())
    info = quantize_draft(draft, "int4", kernel_widths=[1])
    assert info["layers"] == linears - 2
    assert type(draft.lm_head) is torch.nn.Linear
    assert type(draft.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert isinstance(draft.model.layers[0].mlp.up_proj, Int4WeightLinear)


@pytest.mark.parametrize("weights", WEIGHTS)
def test_speculative_output_with_a_rounded_draft_is_the_targets_own(weights):
    target = _tiny(2)
    draft = copy.deepcopy(target)  # a perfect draft, then rounded: it still proposes well
    info = quantize_draft(draft, weights, target)
    assert info["layers"] > 0
    prompt = [5, 9, 14, 3, 22]
    base = SpeculativeDecoder(target, eos_ids=set()).generate(prompt, 24)
    assert base.target_prefill_time > 0 and base.draft_prefill_time == 0  # no draft, no prefill
    for widths in (set(range(1, 9)), set()):  # every step by the kernel, then none
        for m in draft.modules():
            if isinstance(m, QuantWeightLinear):
                m.kernel_widths = widths
        spec = SpeculativeDecoder(target, draft, k=3, eos_ids=set()).generate(prompt, 24)
        assert spec.tokens == base.tokens
        assert spec.target_prefill_time > 0 and spec.draft_prefill_time > 0  # the request model's
        # the rounded perfect draft keeps proposing the target's tokens: most are accepted
        assert spec.accepted > spec.proposed // 2 and spec.target_forwards < len(spec.tokens)


@pytest.mark.parametrize("weights", WEIGHTS)
def test_rounded_drafts_off_cpu_or_with_vllm_are_one_line_naming_the_key(weights, tmp_path):
    with pytest.raises(ConfigError, match=rf"^evaluate\.draft_weights: {weights} .*device is cuda"):
        check_quant_available(weights, torch.device("cuda"))
    check_quant_available("as_loaded", torch.device("cuda"))  # nothing to round: fine anywhere
    with pytest.raises(ConfigError, match=r"^evaluate\.draft_weights: .*vLLM"):
        config_from_dict(
            {
                "run": {"output_dir": str(tmp_path)},
                "target": {"model": "x"},
                "evaluate": {"backend": "vllm", "draft_weights": weights},
            }
        )


def test_the_old_draft_int8_key_reads_as_draft_weights(tmp_path, capsys):
    """Run dirs written before int4 joined carry evaluate.draft_int8 in their config.yaml."""
    base = {"run": {"output_dir": str(tmp_path)}, "target": {"model": "x"}}
    for old, new in ((True, "int8"), (False, "as_loaded")):
        cfg = config_from_dict({**base, "evaluate": {"draft_int8": old}})
        assert cfg.evaluate.draft_weights == new
    assert "evaluate.draft_int8 is deprecated" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^evaluate\.draft_int8: renamed draft_weights"):
        config_from_dict({**base, "evaluate": {"draft_int8": True, "draft_weights": "int4"}})
    with pytest.raises(ConfigError, match=r"^evaluate\.draft_int8: must be one of"):
        config_from_dict({**base, "evaluate": {"draft_int8": "int4"}})


def test_bench_draft_weights_times_every_form_against_the_target(tiny_model_dir):
    """scripts/bench_draft_weights.py on a tiny pair: one line per form with its step, its
    speed over the as-loaded draft and its c, the as-loaded one at exactly 1.00x."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    model = str(tiny_model_dir)
    proc = subprocess.run(
        [sys.executable, "scripts/bench_draft_weights.py", "--target", model, "--draft", model]
        + ["--dtype", "float32", "--repeats", "3", "--context", "16"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = r"^draft (\S+) +([0-9.]+) ms a step +([0-9.]+)x as loaded .* c ([0-9.]+) "
    rows = {
        m[1]: (float(m[2]), float(m[3]), float(m[4])) for m in re.finditer(line, proc.stdout, re.M)
    }
    assert set(rows) == {"as_loaded", "int8", "int4"}
    assert rows["as_loaded"][1] == 1.0
    assert all(ms > 0 and speed > 0 and c > 0 for ms, speed, c in rows.values())
    layers = dict(re.findall(r"^(int8|int4): (\d+) layers", proc.stdout, re.M))
    assert int(layers["int8"]) > 0 and int(layers["int4"]) > 0


def test_bench_draft_step_times_the_same_step_every_way(tiny_model_dir):
    """scripts/bench_draft_step.py on a tiny draft: the fast and static steps' logits match
    the forward's (the script stops otherwise), and every way of stepping is timed, the
    forward at exactly 1.00 of itself."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [sys.executable, "scripts/bench_draft_step.py", "--draft", str(tiny_model_dir)]
        + ["--dtype", "float32", "--repeats", "3", "--context", "16", "--no-compile"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("static, eager", "fast step"):
        assert re.search(rf"^{name}: logits within \S+ of the forward's", proc.stdout, re.M)
    line = r"^  (forward|fast step|matmuls only|static, eager) +([0-9.]+) ms .* ([0-9.]+) of the forward"
    rows = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(line, proc.stdout, re.M)}
    assert set(rows) == {"forward", "fast step", "matmuls only", "static, eager"}
    assert rows["forward"][1] == 1.0 and all(ms > 0 for ms, _ in rows.values())
