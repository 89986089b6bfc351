"""few_row_linear computes F.linear, the context manager is scoped, and the engine's tokens
do not depend on it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.fast_linear import MAX_ROWS, cpu_few_row_linear, few_row_linear
from tests.test_specdec import tiny_pair


@pytest.mark.parametrize("shape", [(1, 2, 24), (1, 5, 24), (3, 1, 24), (2, 3, 24), (7, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_few_row_linear_equals_f_linear(shape, bias):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64)
    w = torch.randn(40, 24, dtype=torch.float64)
    b = torch.randn(40, dtype=torch.float64) if bias else None
    got = few_row_linear(x, w, b)
    assert got.shape == (*shape[:-1], 40)
    torch.testing.assert_close(got, F.linear(x, w, b))


def test_context_routes_few_rows_only_and_restores():
    lin = torch.nn.Linear(8, 4, bias=False)
    original = torch.nn.Linear.forward
    calls = []

    def spy(x, w, b=None):
        calls.append(x.shape)
        return few_row_linear(x, w, b)

    import draftsmith.fast_linear as fl

    fl_few, fl.few_row_linear = fl.few_row_linear, spy
    try:
        with cpu_few_row_linear():
            assert torch.nn.Linear.forward is not original
            for rows in (1, 2, MAX_ROWS, MAX_ROWS + 1):
                lin(torch.randn(rows, 8))
        with cpu_few_row_linear(enabled=False):
            assert torch.nn.Linear.forward is original
            lin(torch.randn(3, 8))
    finally:
        fl.few_row_linear = fl_few
    assert torch.nn.Linear.forward is original
    assert [s[0] for s in calls] == [2, MAX_ROWS]  # 1 row and > MAX_ROWS keep F.linear


def test_context_restores_after_an_error():
    original = torch.nn.Linear.forward
    with pytest.raises(RuntimeError), cpu_few_row_linear():
        raise RuntimeError("boom")
    assert torch.nn.Linear.forward is original


@pytest.mark.parametrize("k", [1, 3, 4])
def test_engine_tokens_and_counts_do_not_depend_on_it(k):
    target, draft = tiny_pair(3, noise=0.3)
    runs = [
        SpeculativeDecoder(target, draft, k=k, eos_ids=[2], few_row_linear=flag).generate(
            [5, 7, 11, 13], 24
        )
        for flag in (True, False)
    ]
    assert runs[0].tokens == runs[1].tokens
    assert (runs[0].proposed, runs[0].accepted) == (runs[1].proposed, runs[1].accepted)
    assert runs[0].accepted > 0  # the draft is neither useless nor the check vacuous
