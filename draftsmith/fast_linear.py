"""Few-row linear layers on CPU: compute x @ W^T as (W @ x^T)^T.

Decoding multiplies every weight matrix by a handful of rows: the k+1 tokens of a verify
pass, the two tokens a draft round may start with, one row per sequence of a decode batch.
torch's F.linear hands BLAS the "x times W transposed" product, and for 2 to 64 rows the
CPU BLAS in torch 2.13 runs it far below memory speed; the same product written as W
times x transposed streams the weights once. Measured on the reference 2-core AMD EPYC
(scripts/bench_linear.py: SmolLM2-135M's 211 weight matrices, cold caches, ms per pass):

    rows         1     2     3     4     5     8    16    64
    F.linear   54.1  76.6 112.0  96.0  84.1 113.0 133.0 238.7
    W @ x^T    52.1  48.8  71.6  47.7  68.1  97.6 112.6 228.4

With it the target's verify forward over k+1 = 2 / 4 / 5 tokens costs 1.03 / 1.17 / 1.39
one-token forwards instead of 1.69 / 1.94 / 1.93 (same script), and that ratio is most of
what speculative decoding can win or lose on a CPU. One row keeps F.linear
(a matrix-vector product either way), so target-only decoding is untouched; GPUs and large
batches keep F.linear too. Results equal F.linear's up to float rounding (a different
summation order), which the greedy lossless check covers like any kernel difference.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # measured faster up to here (table above); above it F.linear


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


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // self.in_features
    if x.device.type != "cpu" or not 1 < rows <= MAX_ROWS:
        return F.linear(x, self.weight, self.bias)
    return few_row_linear(x, self.weight, self.bias)


@contextmanager
def cpu_few_row_linear(enabled: bool = True) -> Iterator[None]:
    """Inside the block every nn.Linear on CPU uses few_row_linear for 2..MAX_ROWS rows."""
    if not enabled:
        yield
        return
    original = torch.nn.Linear.forward
    torch.nn.Linear.forward = _forward
    try:
        yield
    finally:
        torch.nn.Linear.forward = original
