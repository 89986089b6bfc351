"""Int8 weight-only linear layers for a draft decoded on CPU.

A draft's decode step multiplies every weight matrix by one row (a few at a round's first
step), so on CPU it is bound by how many weight bytes it streams, not by arithmetic. Stored
as int8 with one scale per output row, a draft's weights are half its bf16 bytes; torch's
`_weight_int8pack_mm` (the CPU kernel behind torchao's int8 weight-only mode) multiplies
bf16 activations by them. That kernel loses to a float matmul past a few rows, so each
layer also keeps its rounded weights as floats for wide inputs (prompt prefill, replay):
the draft holds 1.5x its bf16 bytes, and which widths take which path is timed once per
draft load on the machine at hand (choose_int8_widths). The README's "int8 draft weights"
section has what it measured on this machine kind (the Qwen2.5-Coder-0.5B draft's step in
int8 against bf16, and the acceptance it costs).

Only the draft changes: the target verifies every drafted token at its own precision, so the
output stays the target's own (the engine's greedy lossless check covers it like any draft);
rounding the draft's weights can only change which tokens it proposes, i.e. acceptance,
which the evaluate stage measures with the int8 draft it decodes with.

Activations stay unquantized (weight-only), which keeps the draft's argmax agreement with its
bf16 self far above int8 activation quantization (measured: README). Layers whose weight is a
parameter of the target (a head reading the target's lm_head) are left alone: the target
must stay exactly as loaded.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from draftsmith.errors import ConfigError

KEY = "evaluate.draft_int8"
WIDTHS = range(1, 9)  # input rows timed: a draft step is 1, a round's first step 2


class Int8WeightLinear(torch.nn.Module):
    """y = x @ (scale * W_int8)^T + b, W rounded per output row to int8 (symmetric).

    Inputs of `int8_widths` rows (a decode step, a round's first step) go through the int8
    kernel; wider ones (a prompt prefill, a teacher-forced replay) through F.linear on the
    same rounded weights kept in the draft's float dtype: the int8 kernel streams half the
    bytes at one row, but measured several times slower than a float matmul at 5+ rows
    (README). Both paths multiply by the same rounded weights, so the draft's proposals do
    not depend on the path beyond float rounding."""

    def __init__(self, linear: torch.nn.Linear, int8_widths: set[int]):
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.int8_widths = int8_widths  # shared by a draft's layers (choose_int8_widths)
        self.register_buffer("weight_int8", q)  # (out, in)
        self.register_buffer("scale", scale.to(torch.bfloat16))  # (out,)
        # the rounded weights as floats, for wide inputs
        self.register_buffer("weight_float", self.dequantized().to(linear.weight.dtype))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows not in self.int8_widths:
            return F.linear(x, self.weight_float.to(x.dtype), _cast(self.bias, x.dtype))
        x2 = x.reshape(rows, self.in_features).to(torch.bfloat16)  # (rows, in)
        # the kernel's fp32-activation path measured several times slower than its bf16 one
        y = torch._weight_int8pack_mm(x2, self.weight_int8, self.scale)  # (rows, out)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The rounded weight as floats, (out, in), in the draft's dtype: code that reads a
        layer's weight for its dtype or shape (an EAGLE-3 head casts its input to
        fc.weight.dtype) sees what the layer multiplies by."""
        return self.weight_float

    def dequantized(self) -> torch.Tensor:
        """The float weight this layer multiplies by, (out, in): for tests and error bounds."""
        return self.weight_int8.float() * self.scale.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def choose_int8_widths(
    layers: list[Int8WeightLinear], widths: range = WIDTHS, repeats: int = 9
) -> tuple[set[int], dict]:
    """The input widths at which the int8 kernel beats F.linear on the rounded float weights,
    timed on these layers on this machine (interleaved repeats, medians); which widths win
    depends on the CPU (README). -> (widths, {width: {"int8": ms, "float": ms}})."""
    times = {(w, path): [] for w in widths for path in ("int8", "float")}
    dtype = layers[0].weight_float.dtype
    inputs = {w: [torch.randn(w, m.in_features, dtype=dtype) for m in layers] for w in widths}
    for _ in range(repeats):
        for w in widths:
            for path in ("int8", "float"):
                chosen = set(widths) if path == "int8" else set()
                for layer in layers:
                    layer.int8_widths = chosen
                start = time.perf_counter()
                for layer, x in zip(layers, inputs[w]):
                    layer(x)
                times[w, path].append(time.perf_counter() - start)
    ms = {w: {p: 1e3 * statistics.median(times[w, p]) for p in ("int8", "float")} for w in widths}
    return {w for w in widths if ms[w]["int8"] < ms[w]["float"]}, ms


def check_int8_available(device: torch.device) -> None:
    """One line naming the key when the int8 draft cannot run here."""
    if device.type != "cpu":
        raise ConfigError(
            f"{KEY}: int8 draft weights are for the native engine on CPU (device is "
            f"{device.type}); set it to false"
        )
    if not hasattr(torch, "_weight_int8pack_mm"):
        raise ConfigError(
            f"{KEY}: this torch build ({torch.__version__}) has no int8 weight-only matmul "
            "(torch._weight_int8pack_mm); set it to false"
        )


def int8_draft(
    draft: torch.nn.Module,
    target: torch.nn.Module | None = None,
    int8_widths: list[int] | None = None,
) -> dict:
    """Replace the nn.Linear layers of `draft` by Int8WeightLinear, in place, and choose by
    timing the widths that take the int8 kernel -> {"layers", "int8_widths", "ms"}.

    `int8_widths`, the choice of an earlier load of the same draft, is reused instead of
    timed again, so one run decodes a draft the same way however often it is reloaded.
    A layer whose weight is one of `target`'s parameters is kept as it is, so a head that
    shares the target's modules never changes the target."""
    check_int8_available(next(draft.parameters()).device)
    shared = {p.data_ptr() for p in target.parameters()} if target is not None else set()
    widths: set[int] = set()  # one set for every layer: the choice is the draft's
    replaced = []
    for parent in list(draft.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.data_ptr() not in shared:
                layer = Int8WeightLinear(child, widths)
                setattr(parent, name, layer)
                replaced.append(layer)
    if not replaced:
        return {"layers": 0, "int8_widths": [], "ms": {}}
    if int8_widths is not None:
        widths |= set(int8_widths)
        return {"layers": len(replaced), "int8_widths": sorted(widths), "ms": {}}
    # time a decoder layer's worth: the first MLP-sized layers (the largest but the head)
    body = [m for m in replaced if m.out_features < max(r.out_features for r in replaced)]
    chosen, ms = choose_int8_widths((body or replaced)[:7])
    widths |= chosen
    for layer in replaced:
        layer.int8_widths = widths
    return {"layers": len(replaced), "int8_widths": sorted(widths), "ms": ms}
