"""Int8 and int4 weight-only linear layers for a draft decoded on CPU (evaluate.draft_weights).

A draft's decode step multiplies every weight matrix by one row (a few at a round's first
step), so on CPU it is bound by how many weight bytes it streams, not by arithmetic. Fewer
bytes per weight make the step cheaper:
- int8: one bf16 scale per output row, symmetric; torch's `_weight_int8pack_mm` (the CPU
  kernel behind torchao's int8 weight-only mode). Half the bf16 bytes.
- int4: one bf16 scale and offset per group of 32 inputs of a row, asymmetric (16 levels
  from the group's minimum to its maximum); torch's `_weight_int4pack_mm_for_cpu`. A quarter
  of the bf16 bytes plus the group's scale and offset.
Both kernels lose to a float matmul past a few rows, so each layer also keeps its rounded
weights as floats for wide inputs (prompt prefill, replay), and which widths take the kernel
is timed once per draft load on the machine at hand (choose_kernel_widths). The README's
"Quantized draft weights" section has what was measured on this machine kind (the
Qwen2.5-Coder-0.5B draft's step in each form, and the acceptance each costs).

Only the draft changes: the target verifies every drafted token at its own precision, so the
output stays the target's own (the engine's greedy lossless check covers it like any draft);
rounding the draft's weights can only change which tokens it proposes, i.e. acceptance,
which the evaluate stage measures with the rounded draft it decodes with.

Activations stay unquantized (weight-only). Layers whose weight is a parameter of the target
(a head reading the target's lm_head) are left alone: the target must stay exactly as loaded.
"""

from __future__ import annotations

import abc
import statistics
import time

import torch
import torch.nn.functional as F

from draftsmith.errors import ConfigError

KEY = "evaluate.draft_weights"
WIDTHS = range(1, 9)  # input rows timed: a draft step is 1, a round's first step 2
INT4_GROUP = 32  # inputs sharing one int4 scale and offset (the kernel takes 32..256)


class QuantWeightLinear(torch.nn.Module, abc.ABC):
    """y = x @ W_q^T + b with W_q the layer's weight rounded to a few bits (a subclass says how).

    Inputs of `kernel_widths` rows (a decode step, a round's first step) go through the
    quantized kernel; wider ones (a prompt prefill, a teacher-forced replay) through F.linear
    on the same rounded weights kept in the draft's float dtype. Both paths multiply by the
    same rounded weights, so the draft's proposals do not depend on the path beyond float
    rounding."""

    bits: int

    def __init__(self, linear: torch.nn.Linear, kernel_widths: set[int]):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel_widths = kernel_widths  # shared by a draft's layers (choose_kernel_widths)
        rounded = self._quantize(linear.weight.detach().float())  # (out, in)
        # the rounded weights as floats, for wide inputs
        self.register_buffer("weight_float", rounded.to(linear.weight.dtype))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    @abc.abstractmethod
    def _quantize(self, w: torch.Tensor) -> torch.Tensor:
        """Store the kernel's buffers for w (out, in), fp32 -> the rounded weight, fp32."""

    @abc.abstractmethod
    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, in) bf16 -> (rows, out), by the quantized kernel."""

    def dequantized(self) -> torch.Tensor:
        """The float weight this layer multiplies by, (out, in): for tests and error bounds."""
        return self.weight_float.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows not in self.kernel_widths:
            return F.linear(x, _cast(self.weight_float, x.dtype), _cast(self.bias, x.dtype))
        # both kernels' fp32-activation paths measured several times slower than bf16
        y = self._kernel(_cast(x.reshape(rows, self.in_features), torch.bfloat16))  # (rows, out)
        if self.bias is not None:
            y = y + _cast(self.bias, y.dtype)
        return _cast(y.reshape(*x.shape[:-1], self.out_features), x.dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The rounded weight as floats, (out, in), in the draft's dtype: code that reads a
        layer's weight for its dtype or shape (an EAGLE-3 head casts its input to
        fc.weight.dtype) sees what the layer multiplies by."""
        return self.weight_float

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits} weights"


class Int8WeightLinear(QuantWeightLinear):
    """W rounded per output row to int8, symmetric: W_q = scale[row] * q, q in -127..127."""

    bits = 8

    def _quantize(self, w: torch.Tensor) -> torch.Tensor:
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.register_buffer("weight_int8", q)  # (out, in)
        self.register_buffer("scale", scale.to(torch.bfloat16))  # (out,)
        return q.float() * self.scale.float()[:, None]

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight_int8, self.scale)


class Int4WeightLinear(QuantWeightLinear):
    """W rounded per group of INT4_GROUP inputs of a row, asymmetric: W_q = lo + step * q with
    q in 0..15, lo the group's minimum and step its range / 15. The kernel reads the pair as
    (scale, zero) with W_q = (q - 8) * scale + zero, so zero = lo + 8 * step."""

    bits = 4

    def _quantize(self, w: torch.Tensor) -> torch.Tensor:
        out, inp = w.shape
        g = w.reshape(out, inp // INT4_GROUP, INT4_GROUP)  # (out, groups, 32)
        lo, hi = g.amin(-1), g.amax(-1)  # (out, groups)
        step = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        # offsets and steps are stored in bf16 (the kernel's dtype): round q against those
        step, lo = step.to(torch.bfloat16).float(), lo.to(torch.bfloat16).float()
        q = torch.round((g - lo[..., None]) / step[..., None]).clamp(0, 15)  # (out, groups, 32)
        zero = (lo + 8 * step).to(torch.bfloat16).float()
        packed = torch._convert_weight_to_int4pack_for_cpu(q.reshape(out, inp).int(), 1)
        self.register_buffer("packed", packed)
        # (groups, out, 2): the layout _weight_int4pack_mm_for_cpu reads
        scale_zero = torch.stack([step, zero], -1).transpose(0, 1).contiguous()
        self.register_buffer("scale_zero", scale_zero.to(torch.bfloat16))
        return ((q - 8) * step[..., None] + zero[..., None]).reshape(out, inp)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, INT4_GROUP, self.scale_zero)


LAYERS = {"int8": Int8WeightLinear, "int4": Int4WeightLinear}
KERNELS = {"int8": "_weight_int8pack_mm", "int4": "_weight_int4pack_mm_for_cpu"}


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """t in `dtype`; a tensor already in it as it is (a draft step makes 169 of these calls,
    and each no-op .to() is still a dispatch)."""
    if t is None or t.dtype == dtype:
        return t
    return t.to(dtype)


def quantizable(linear: torch.nn.Linear, weights: str) -> bool:
    """The int4 kernel takes whole groups of inputs and outputs in blocks of 16: a layer with
    in_features not a multiple of 32 or out_features not one of 16 stays as it is."""
    if weights != "int4":
        return True
    return linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0


def choose_kernel_widths(
    layers: list[QuantWeightLinear], widths: range = WIDTHS, repeats: int = 9
) -> tuple[set[int], dict]:
    """The input widths at which the quantized kernel beats F.linear on the rounded float
    weights, timed on these layers on this machine (interleaved repeats, medians); which
    widths win depends on the CPU (README). -> (widths, {width: {"kernel": ms, "float": ms}})."""
    times = {(w, path): [] for w in widths for path in ("kernel", "float")}
    dtype = layers[0].weight_float.dtype
    inputs = {w: [torch.randn(w, m.in_features, dtype=dtype) for m in layers] for w in widths}
    for _ in range(repeats):
        for w in widths:
            for path in ("kernel", "float"):
                chosen = set(widths) if path == "kernel" else set()
                for layer in layers:
                    layer.kernel_widths = chosen
                start = time.perf_counter()
                for layer, x in zip(layers, inputs[w]):
                    layer(x)
                times[w, path].append(time.perf_counter() - start)
    paths = ("kernel", "float")
    ms = {w: {p: 1e3 * statistics.median(times[w, p]) for p in paths} for w in widths}
    return {w for w in widths if ms[w]["kernel"] < ms[w]["float"]}, ms


def check_quant_available(weights: str, device: torch.device) -> None:
    """One line naming the key when the draft cannot be decoded with `weights` here."""
    if weights == "as_loaded":
        return
    if device.type != "cpu":
        raise ConfigError(
            f"{KEY}: {weights} draft weights are for the native engine on CPU (device is "
            f"{device.type}); set it to as_loaded"
        )
    if not hasattr(torch, KERNELS[weights]):
        raise ConfigError(
            f"{KEY}: this torch build ({torch.__version__}) has no {weights} weight-only "
            f"matmul (torch.{KERNELS[weights]}); set it to as_loaded"
        )


def quantize_draft(
    draft: torch.nn.Module,
    weights: str,
    target: torch.nn.Module | None = None,
    kernel_widths: list[int] | None = None,
) -> dict:
    """Replace the nn.Linear layers of `draft` by `weights` ("int8", "int4") layers, in place,
    and choose by timing the widths that take the quantized kernel
    -> {"weights", "layers", "kernel_widths", "ms"}.

    `kernel_widths`, the choice of an earlier load of the same draft, is reused instead of
    timed again, so one run decodes a draft the same way however often it is reloaded.
    A layer whose weight is one of `target`'s parameters is kept as it is, so a head that
    shares the target's modules never changes the target."""
    check_quant_available(weights, next(draft.parameters()).device)
    shared = {p.data_ptr() for p in target.parameters()} if target is not None else set()
    widths: set[int] = set()  # one set for every layer: the choice is the draft's
    replaced = []
    for parent in list(draft.modules()):
        for name, child in list(parent.named_children()):
            if (
                type(child) is torch.nn.Linear
                and child.weight.data_ptr() not in shared
                and quantizable(child, weights)
            ):
                layer = LAYERS[weights](child, widths)
                setattr(parent, name, layer)
                replaced.append(layer)
    info = {"weights": weights, "layers": len(replaced), "kernel_widths": [], "ms": {}}
    if not replaced:
        return info
    if kernel_widths is not None:
        widths |= set(kernel_widths)
        return {**info, "kernel_widths": sorted(widths)}
    # time a decoder layer's worth: the first MLP-sized layers (the largest but the head)
    body = [m for m in replaced if m.out_features < max(r.out_features for r in replaced)]
    chosen, ms = choose_kernel_widths((body or replaced)[:7])
    widths |= chosen
    for layer in replaced:
        layer.kernel_widths = widths
    return {**info, "kernel_widths": sorted(widths), "ms": ms}
