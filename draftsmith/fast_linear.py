"""Few-row linear layers on CPU: compute x @ W^T as (W @ x^T)^T.

Decoding multiplies every weight matrix by a handful of rows: the k+1 tokens of a verify
pass, the two tokens a draft round may start with, one row per sequence of a decode batch.
torch's F.linear hands BLAS the "x times W transposed" product, and for 2 to 64 rows the
CPU BLAS behind torch can run it well below memory speed; the same product written as W
times x transposed can stream the weights once. Which form is faster depends on the CPU,
its BLAS and the dtype, even between machines of one kind (the README's per-q cost tables
have the measurements). So the form is chosen per forward width by timing both on the
target (evaluate/timing.py choose_few_rows, what evaluate.cpu_few_row_linear=auto does);
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

Scope: `cpu_few_row_linear(*models)` changes only the nn.Linear modules of the models it
is given (an instance-level forward, removed on exit); torch.nn.Linear itself and every
other model in the process keep F.linear, inside the block too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # the widest few-row forward the W @ x^T form is ever considered for


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


def _forward_for(rows_set):
    """An nn.Linear forward that takes the W @ x^T form for these row counts on CPU."""

    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if x.device.type != "cpu" or rows not in rows_set:
            return F.linear(x, self.weight, self.bias)
        if rows == 1:
            return padded_one_row_linear(x, self.weight, self.bias)
        return few_row_linear(x, self.weight, self.bias)

    return forward


class RowSwitch(set):
    """A mutable set of row counts, read by the patched forwards at every call: a benchmark
    flips one form on and off without patching again (evaluate/timing.py choose_few_rows)."""


def few_row_counts(enabled) -> frozenset[int] | RowSwitch:
    """The row counts the W @ x^T form is used for: True = 2..MAX_ROWS, False/None = none,
    or an explicit collection (a per-machine choice: timing.choose_few_rows), where 1 means
    the padded one-row form."""
    if isinstance(enabled, RowSwitch):
        return enabled
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
    """Inside the block the nn.Linear layers of `models` use few_row_linear for the row
    counts `enabled` names (few_row_counts: True = 2..MAX_ROWS) on CPU; nothing else
    changes, and everything is restored on exit (errors too)."""
    rows = few_row_counts(enabled)
    patched = _linears(models) if rows or isinstance(rows, RowSwitch) else []
    forward = _forward_for(rows)
    for m in patched:
        m.forward = MethodType(forward, m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward
