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


@pytest.fixture
def spy(monkeypatch):
    """Record (rows, weight) of every few_row_linear call the patched forwards make."""
    import draftsmith.fast_linear as fl

    calls = []
    real = fl.few_row_linear

    def record(x, w, b=None):
        calls.append((x.numel() // w.shape[1], w))
        return real(x, w, b)

    monkeypatch.setattr(fl, "few_row_linear", record)
    return calls


def test_context_routes_few_rows_only_and_restores(spy):
    lin = torch.nn.Linear(8, 4, bias=False)
    original = torch.nn.Linear.forward
    with cpu_few_row_linear(lin):
        assert "forward" in vars(lin) and torch.nn.Linear.forward is original
        for rows in (1, 2, MAX_ROWS, MAX_ROWS + 1):
            lin(torch.randn(rows, 8))
    with cpu_few_row_linear(lin, enabled=False):
        assert "forward" not in vars(lin)
        lin(torch.randn(3, 8))
    assert "forward" not in vars(lin) and torch.nn.Linear.forward is original
    assert [rows for rows, _ in spy] == [2, MAX_ROWS]  # 1 row and > MAX_ROWS keep F.linear


def test_context_restores_after_an_error():
    lin = torch.nn.Linear(8, 4)
    with pytest.raises(RuntimeError), cpu_few_row_linear(lin):
        raise RuntimeError("boom")
    assert "forward" not in vars(lin)


def test_a_linear_outside_the_given_models_keeps_f_linear(spy):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    other = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with cpu_few_row_linear(model, None, model):  # None (no draft) and repeats are fine
        other(x)
        model(x)
        assert "forward" not in vars(other)
    assert [(rows, w is model[0].weight or w is model[2].weight) for rows, w in spy] == [
        (3, True),
        (3, True),
    ]


def test_another_model_used_during_the_engine_keeps_f_linear(spy):
    """A model run while the engine decodes (here: from a hook on the target) is not patched."""
    target, draft = tiny_pair(3, noise=0.3)
    outsider = torch.nn.Linear(target.config.hidden_size, 5)
    ran = []

    def hook(module, args, output):
        ran.append(outsider(torch.randn(3, target.config.hidden_size)).shape)

    target.model.norm.register_forward_hook(hook)
    SpeculativeDecoder(target, draft, k=3, eos_ids=[2]).generate([5, 7, 11, 13], 12)
    assert ran and all(shape == (3, 5) for shape in ran)
    weights = [w for _, w in spy]
    assert weights and not any(w is outsider.weight for w in weights)
    targets = {id(p) for p in target.parameters()}
    assert any(id(w) in targets for w in weights)  # the target's verify passes were routed
    assert not any("forward" in vars(m) for m in target.modules())  # and restored


@pytest.mark.parametrize("k", [1, 3, 4])
def test_engine_tokens_and_counts_do_not_depend_on_it(k):
    target, draft = tiny_pair(3, noise=0.3)
    runs = [
        SpeculativeDecoder(target, draft, k=k, eos_ids=[2], few_row_linear=flag).generate(
            [5, 7, 11, 13], 24
        )
        for flag in (True, False, [3], [k + 1])  # always, never, and per-width choices
    ]
    for other in runs[1:]:
        assert other.tokens == runs[0].tokens
        assert (other.proposed, other.accepted) == (runs[0].proposed, runs[0].accepted)
    assert runs[0].accepted > 0  # the draft is neither useless nor the check vacuous


def test_only_the_chosen_widths_take_the_few_row_form(spy):
    lin = torch.nn.Linear(8, 4, bias=False)
    with cpu_few_row_linear(lin, enabled=[3, 5]):
        for rows in (1, 2, 3, 4, 5):
            lin(torch.randn(rows, 8))
    assert [rows for rows, _ in spy] == [3, 5]


@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 24), (24,)])
def test_padded_one_row_equals_f_linear_and_is_taken_when_chosen(spy, shape):
    """Width 1 chosen: the row is multiplied as two rows (itself and a copy) in W @ x^T,
    and the result is F.linear's, shape included."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40, dtype=torch.float64)
    x = torch.randn(*shape, dtype=torch.float64)
    with cpu_few_row_linear(lin, enabled=[1]):
        got = lin(x)
    assert [rows for rows, _ in spy] == [2]  # one row in, two rows through W @ x^T
    assert got.shape == (*shape[:-1], 40)
    torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias))
    with cpu_few_row_linear(lin, enabled=True):  # forced on: 2..MAX_ROWS, one row untouched
        lin(x)
    assert len(spy) == 1


def test_target_only_decoding_takes_the_chosen_one_row_form_and_keeps_its_tokens(spy):
    """The baseline decodes with the same per-width choice as the speculative decoder: with
    width 1 chosen, its one-token steps take the padded form, and its tokens are unchanged."""
    target, _ = tiny_pair(3, noise=0.3)
    prompt = [5, 7, 11, 13]
    plain = SpeculativeDecoder(target, None, eos_ids=[2], few_row_linear=False).generate(prompt, 16)
    assert spy == []
    padded = SpeculativeDecoder(target, None, eos_ids=[2], few_row_linear=[1]).generate(prompt, 16)
    assert spy and {rows for rows, _ in spy} == {2}  # every one-row matmul went padded
    assert padded.tokens == plain.tokens


def test_choose_few_rows_picks_the_faster_form_per_width(monkeypatch, spy):
    """The choice follows the clock: with W @ x^T injected as slower at width 2 and faster at
    width 3, only 3 is chosen; both forms really run through the switch."""
    from draftsmith.evaluate import timing

    target, _ = tiny_pair(1)
    seen = []

    def fake_time(name, run, sync):
        run()
        seen.append(name)
        form, width = name.rsplit("_", 1)
        faster = (form == "W@x^T") == (width == "3")
        return 1.0 if faster else 2.0

    monkeypatch.setattr(timing, "time_step", fake_time)
    out = timing.choose_few_rows(target, [5, 6, 7, 8], [1, 2, 3], repeats=4)
    assert out["few_rows"] == [3]
    assert out["ms"]["2"] == {"F.linear": 1000.0, "W@x^T": 2000.0}
    assert sorted(set(seen)) == [f"{f}_{w}" for f in ("F.linear", "W@x^T") for w in (1, 2, 3)]
    # the W@x^T steps really took that form (width 1 padded to two rows)
    assert {rows for rows, _ in spy} == {2, 3}
    assert not any("forward" in vars(m) for m in target.modules())  # restored


@pytest.mark.gpu
def test_on_cuda_forwards_keep_f_linear_and_decoding_stays_lossless(spy):
    target, draft = (m.cuda() for m in tiny_pair(3, noise=0.3))
    prompt = [5, 7, 11, 13]
    spec = SpeculativeDecoder(target, draft, k=3, eos_ids=[2]).generate(prompt, 24)
    base = SpeculativeDecoder(target, None, eos_ids=[2]).generate(prompt, 24)
    assert spy == []  # CUDA inputs never take the few-row path
    assert spec.tokens == base.tokens and spec.accepted > 0  # float64: no near-tie flips
