"""Few-row linear layers on CPU: x @ W^T as (W @ x^T)^T, or on a weight packed once.

Decoding multiplies every weight matrix by a handful of rows: the k+1 tokens of a verify
pass, the two tokens a draft round may start with, one row per sequence of a decode batch.
torch's F.linear hands BLAS the "x times W transposed" product, and for 2 to 64 rows the
CPU BLAS behind torch can run it well below memory speed; the same product written as W
times x transposed can stream the weights once. Which form is faster depends on the CPU,
its BLAS and the dtype, even between machines of one kind (the README's per-q cost tables
have the measurements). So the form is chosen per forward width by timing the forms on the
target (`choose_linear_forms` below, what evaluate.cpu_few_row_linear=auto does);
`scripts/bench_linear.py` and `scripts/bench_costs.py` measure them side by side on the
machine at hand.

One row is a matrix-vector product in either form, but on CPUs with native bf16 matmuls a
two-row product runs faster than a one-row one (2026-12-06, this 2-core CPU: a 1536 x 8960
bf16 weight times 1 row 0.97 ms, times 2 rows as W @ x^T 0.68 ms; target-only greedy decoding
of the 1.5B in bf16 1.21-1.26x faster, `scripts/bench_one_row.py`). So width 1 may be chosen too:
the row is padded with a copy of itself, multiplied as W @ x^T, and the copy dropped
(`padded_one_row_linear`). Like every width it is taken only where timing picks it, and the
target-only baseline decodes with the same choice, so no speedup is measured against a
baseline slower than it has to be. GPUs and large batches keep F.linear. Results equal
F.linear's up to float rounding (a different summation order), which the greedy lossless
check covers like any kernel difference.

A third form keeps F.linear's arithmetic and drops a cost it pays on every call: for bf16
weights torch hands the product to oneDNN, which first reorders the weight into its blocked
layout, a full pass over the weight's bytes each time. The packed form reorders each weight
once (`packed_weight`, cached per layer) and calls oneDNN's linear on the packed copy
(2026-12-07, the EPYC: the bf16 1.5B's forward over 1/5/8 tokens 1.29/1.53/1.49x faster,
logits bit-identical to F.linear's). It costs a second copy of each packed weight in memory
(3.1 GB for the 1.5B), freed by `drop_packed`; it is chosen per width by timing like the
others, and only bf16 weights on CPU take it.

Scope: `cpu_few_row_linear(*models)` changes only the nn.Linear modules of the models it
is given (an instance-level forward, removed on exit); torch.nn.Linear itself and every
other model in the process keep F.linear, inside the block too.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MethodType

import torch
import torch.nn.functional as F

from draftsmith.clock import Step, cached_forward, interleaved, quartiles

MAX_ROWS = 64  # the widest few-row forward the W @ x^T form is ever considered for
F_LINEAR, FEW_ROW, PACKED = "F.linear", "W@x^T", "packed"
FORMS = (F_LINEAR, FEW_ROW, PACKED)

# layer -> ((weight's data_ptr, version, shape, dtype, device), its packed copy):
# packed_weight's cache
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """F.linear(x, weight, bias) for x (..., in) with few rows, as weight @ x^T."""
    rows = x.numel() // weight.shape[1]
    # the fast BLAS path is row-major W times the transpose of a row-major x; both the
    # input and the (rows, out) result are kept row-major (a transposed view downstream
    # measured slower: the next layer's x^T would then be the slow layout)
    x2 = x.reshape(rows, -1).contiguous()  # (rows, in)
    y = (weight @ x2.T).T.contiguous()  # (out, rows) -> (rows, out)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


def padded_one_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """F.linear(x, weight, bias) for one row x (..., 1, in) or (in,): the row and a copy of
    it as W @ x^T, the copy's output dropped (two rows can take a faster kernel than one)."""
    row = x.reshape(1, -1)  # (1, in)
    y = few_row_linear(torch.cat([row, row]), weight, bias)[:1]  # (2, out) -> (1, out)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def packable(weight: torch.Tensor) -> bool:
    """Whether `weight` can take the prepacked form: a bf16 weight on CPU, on a CPU where
    torch's oneDNN bf16 linear runs (the op inductor's CPU freezing pass uses)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and cpu_can_pack_bf16()


@functools.cache
def cpu_can_pack_bf16() -> bool:
    """Whether oneDNN's bf16 weight reorder runs on this CPU, tried once on a tiny weight.

    It needs AVX512 (bw, vl, dq) or AVX-NE-CONVERT, which an AVX2-only CPU lacks (an AMD
    EPYC of 2026-12-07 refused it: "bf16 path needs the cpu support avx_ne_convert or
    avx512bw, avx512vl and avx512dq"), and torch names no query for it: asking the op is
    the one check that cannot disagree with the op.
    """
    if not (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


def packed_weight(layer: torch.nn.Linear) -> torch.Tensor | None:
    """The layer's weight reordered once into oneDNN's blocked layout (cached per layer and
    remade when the weight changes), or None where it cannot be (not packable, or a weight
    being trained: the packed op has no backward)."""
    w = layer.weight
    if w.requires_grad and torch.is_grad_enabled():
        return None
    # an inference tensor (made under inference_mode) keeps no version counter
    version = None if w.is_inference() else w._version
    stamp = (w.data_ptr(), version, tuple(w.shape), w.dtype, w.device)
    hit = _PACKED.get(layer)
    if hit is not None and hit[0] == stamp:  # every call of a packed forward: keep it cheap
        return hit[1]
    if not packable(w):
        return None
    # the batch-size hint only tunes the layout: 1 measured as good as 5 or 16 for 1-8 rows
    _PACKED[layer] = (stamp, torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1))
    return _PACKED[layer][1]


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None):
    """F.linear(x, weight, bias) with the weight as packed_weight made it."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def drop_packed(*models) -> None:
    """Free the packed copies of `models`' layers (a bf16 1.5B's are 3.1 GB)."""
    for model in models:
        for m in [] if model is None else model.modules():
            _PACKED.pop(m, None)


def _forward_for(forms):
    """An nn.Linear forward that takes, on CPU, the form `forms` names for each input's row
    count (F.linear for row counts it does not name)."""

    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        form = forms.get(rows, F_LINEAR) if x.device.type == "cpu" else F_LINEAR
        if form == FEW_ROW:
            if rows == 1:
                return padded_one_row_linear(x, self.weight, self.bias)
            return few_row_linear(x, self.weight, self.bias)
        if form == PACKED and (packed := packed_weight(self)) is not None:
            return packed_linear(x, packed, self.bias)
        return F.linear(x, self.weight, self.bias)

    return forward


class FormSwitch(dict):
    """A mutable {row count: form}, read by the patched forwards at every call: a benchmark
    switches forms without patching again (`choose_linear_forms` below)."""


def linear_forms(enabled) -> dict[int, str]:
    """{row count: form} from `enabled`: a mapping (a per-machine choice,
    choose_linear_forms; JSON's string keys accepted), a FormSwitch (itself), or the
    W @ x^T widths few_row_counts reads (True, False/None, a collection)."""
    if isinstance(enabled, FormSwitch):
        return enabled
    if isinstance(enabled, Mapping):
        forms = {int(rows): form for rows, form in enabled.items()}
        unknown = sorted(set(forms.values()) - set(FORMS))
        if unknown:
            raise ValueError(f"unknown linear form(s) {unknown}; expected one of {FORMS}")
        return forms
    return {rows: FEW_ROW for rows in few_row_counts(enabled)}


def few_row_counts(enabled) -> frozenset[int]:
    """The row counts the W @ x^T form is used for: True = 2..MAX_ROWS, False/None = none,
    or an explicit collection, where 1 means the padded one-row form."""
    if enabled is True:
        return frozenset(range(2, MAX_ROWS + 1))
    if not enabled:
        return frozenset()
    return frozenset(int(r) for r in enabled if int(r) >= 1)


def _linears(models) -> list[torch.nn.Linear]:
    """The plain nn.Linear modules of `models` (None skipped, shared modules once)."""
    seen, out = set(), []
    for model in models:
        if model is None:
            continue
        for m in model.modules():
            # a module that already has an instance forward (an accelerate hook, an outer
            # block of this context) is left as it is
            plain = isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward
            if plain and "forward" not in vars(m) and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


@contextmanager
def cpu_few_row_linear(*models, enabled=True) -> Iterator[None]:
    """Inside the block the nn.Linear layers of `models` take, on CPU, the form `enabled`
    names for each row count (linear_forms: {rows: form}, or True = W @ x^T at 2..MAX_ROWS);
    nothing else changes, and everything is restored on exit (errors too). Packed copies
    stay cached after the block (drop_packed frees them)."""
    forms = linear_forms(enabled)
    patched = _linears(models) if forms or isinstance(forms, FormSwitch) else []
    forward = _forward_for(forms)
    for m in patched:
        m.forward = MethodType(forward, m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


# ----------------------------------------------------------------------------- choosing by timing


def in_form(step: Step, switch: FormSwitch, width: int, form: str) -> Step:
    """`step` (a forward `width` tokens wide) run with its linear layers in `form`: the
    switch is set just before the run, inside a cpu_few_row_linear(..., enabled=switch)."""
    run, reset = step

    def switched() -> None:
        switch.clear()
        switch[width] = form
        run()

    return switched, reset


@torch.inference_mode()
def choose_linear_forms(
    model, context: Sequence[int], widths: Sequence[int], repeats: int, margin: float = 0.03
) -> dict:
    """Which form of the linear layers a forward over w tokens should take on this machine,
    for each width w (a verify pass is k + 1 wide, a decode step 1), by timing them.

    The same cached forward runs through each form of this module: F.linear, W @ x^T (one
    row padded to two at w = 1) and, where the model's weights can be packed (bf16 on CPU),
    F.linear's oneDNN kernel on weights packed once; interleaved and repeated
    like the cost timing. Another form is chosen over F.linear only where its median is
    lower by more than `margin`, the fastest of them where several are. Which one wins
    depends on the CPU, the BLAS and the dtype: measured, not assumed. Where no width takes
    the packed form, its copies are freed.
    Returns {"forms": {w: form}, "ms": {w: {form: ms}}, "repeats"} (w as strings, as in JSON).
    """
    widths = sorted({int(w) for w in widths if w >= 1})
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    forms = [F_LINEAR, FEW_ROW] + ([PACKED] if any(packable(m.weight) for m in linears) else [])
    switch = FormSwitch()
    feed = (list(context[-1:]) * max(widths, default=1))[: max(widths, default=1)]
    steps: dict[str, Step] = {}
    for w in widths:
        step = cached_forward(model, context, feed[:w])
        steps |= {f"{form}_{w}": in_form(step, switch, w, form) for form in forms}
    times = {}
    if steps:
        with cpu_few_row_linear(model, enabled=switch):
            times = interleaved(steps, repeats)
    ms, chosen = {}, {}
    for w in widths:
        ms[str(w)] = {form: 1e3 * quartiles(times[f"{form}_{w}"])[1] for form in forms}
        best = min(forms, key=lambda form: ms[str(w)][form])
        if ms[str(w)][best] < ms[str(w)][F_LINEAR] * (1 - margin):
            chosen[str(w)] = best
    if PACKED not in chosen.values():
        drop_packed(model)
    return {"forms": chosen, "ms": ms, "repeats": repeats}
