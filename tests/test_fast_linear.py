"""few_row_linear and the packed form compute F.linear, the context manager is scoped, the
per-width choice follows the clock, and the engine's tokens do not depend on the form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import draftsmith.fast_linear as fl
from draftsmith.evaluate.engine import SpeculativeDecoder
from draftsmith.fast_linear import MAX_ROWS, cpu_few_row_linear, few_row_linear
from tests.test_specdec import tiny_pair

# oneDNN's bf16 packed linear needs AVX512 (bw, vl, dq) or AVX-NE-CONVERT; on an AVX2-only
# CPU the form is never chosen (tested below), and these tests of the form itself cannot run
needs_packing = pytest.mark.skipif(
    not fl.cpu_can_pack_bf16(), reason="this CPU cannot run oneDNN's bf16 packed linear"
)


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
    calls = []
    real = fl.few_row_linear

    def record(x, w, b=None):
        calls.append((x.numel() // w.shape[1], w))
        return real(x, w, b)

    monkeypatch.setattr(fl, "few_row_linear", record)
    return calls


@pytest.fixture
def packed_spy(monkeypatch):
    """Record (rows, packed weight) of every packed_linear call the patched forwards make."""
    calls = []
    real = fl.packed_linear

    def record(x, packed, b=None):
        calls.append((x.numel() // x.shape[-1], packed))
        return real(x, packed, b)

    monkeypatch.setattr(fl, "packed_linear", record)
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
        SpeculativeDecoder(target, draft, k=k, eos_ids=[2], linear_forms=flag).generate(
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
    plain = SpeculativeDecoder(target, None, eos_ids=[2], linear_forms=False).generate(prompt, 16)
    assert spy == []
    padded = SpeculativeDecoder(target, None, eos_ids=[2], linear_forms=[1]).generate(prompt, 16)
    assert spy and {rows for rows, _ in spy} == {2}  # every one-row matmul went padded
    assert padded.tokens == plain.tokens


@needs_packing
def test_choose_linear_forms_picks_the_fastest_form_per_width(monkeypatch, spy, packed_spy):
    """The choice follows the clock, per width: with the packed form injected fastest at
    width 1, W @ x^T at width 2 and F.linear at width 3 (nothing chosen there), the choice is
    exactly that; a form only a hair (< margin) faster than F.linear is not taken; every form
    really runs through the switch."""
    from draftsmith import clock

    target = tiny_pair(1)[0].to(torch.bfloat16)  # bf16: the packed form is timed too
    fastest = {"1": "packed", "2": "W@x^T", "3": "F.linear", "4": "packed"}
    seen = []

    def fake_time(name, run, sync):
        run()
        seen.append(name)
        form, width = name.rsplit("_", 1)
        if width == "4":  # packed 2% faster than F.linear: within the margin
            return {"F.linear": 1.0, "W@x^T": 1.5, "packed": 0.98}[form]
        return 1.0 if form == fastest[width] else 2.0

    monkeypatch.setattr(clock, "time_step", fake_time)
    out = fl.choose_linear_forms(target, [5, 6, 7, 8], [1, 2, 3, 4], repeats=4)
    assert out["forms"] == {"1": "packed", "2": "W@x^T"}
    assert out["ms"]["2"] == {"F.linear": 2000.0, "W@x^T": 1000.0, "packed": 2000.0}
    forms = ("F.linear", "W@x^T", "packed")
    assert sorted(set(seen)) == sorted(f"{f}_{w}" for f in forms for w in (1, 2, 3, 4))
    # the W@x^T steps really took that form (width 1 padded to two rows), and so did packed
    assert {rows for rows, _ in spy} == {2, 3, 4}
    assert {rows for rows, _ in packed_spy} == {1, 2, 3, 4}
    assert not any("forward" in vars(m) for m in target.modules())  # restored
    assert any(m in fl._PACKED for m in target.modules())  # chosen at width 1: kept


@needs_packing
def test_choose_linear_forms_frees_the_packed_copies_where_none_is_chosen(monkeypatch):
    from draftsmith import clock

    target = tiny_pair(1)[0].to(torch.bfloat16)
    monkeypatch.setattr(
        clock, "time_step", lambda name, run, sync: (run(), 1.0 if "F.linear" in name else 2.0)[1]
    )
    out = fl.choose_linear_forms(target, [5, 6, 7, 8], [1, 2], repeats=2)
    assert out["forms"] == {}
    assert not any(m in fl._PACKED for m in target.modules())


def test_an_fp32_model_is_never_timed_packed(monkeypatch):
    from draftsmith import clock

    target, _ = tiny_pair(1)
    seen = []
    monkeypatch.setattr(
        clock, "time_step", lambda name, run, sync: (seen.append(name), run(), 1.0)[-1]
    )
    fl.choose_linear_forms(target, [5, 6, 7, 8], [1, 2], repeats=2)
    assert seen and not any(name.startswith("packed") for name in seen)


@needs_packing
@pytest.mark.parametrize("shape", [(1, 1, 48), (1, 5, 48), (3, 48), (48,)])
@pytest.mark.parametrize("bias", [False, True])
@torch.inference_mode()  # as the engine runs (with gradients on, a parameter is not packed)
def test_packed_linear_equals_f_linear(shape, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80, bias=bias, dtype=torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    packed = fl.packed_weight(lin)
    assert packed is not None
    got = fl.packed_linear(x, packed, lin.bias)
    assert got.shape == (*shape[:-1], 80)
    torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias))


@needs_packing
@torch.no_grad()
def test_the_packed_copy_is_cached_and_remade_when_the_weight_changes():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80, bias=False, dtype=torch.bfloat16)
    x = torch.randn(2, 48, dtype=torch.bfloat16)
    first = fl.packed_weight(lin)
    assert fl.packed_weight(lin) is first  # packed once
    lin.weight.mul_(-1)  # in place: same storage, a new version
    again = fl.packed_weight(lin)
    assert again is not first
    torch.testing.assert_close(fl.packed_linear(x, again), F.linear(x, lin.weight))
    fl.drop_packed(lin)
    assert lin not in fl._PACKED


def test_packed_form_falls_back_to_f_linear_where_it_cannot_run(packed_spy):
    """fp32 weights and weights being trained (the packed op has no backward) keep F.linear,
    with gradients intact."""
    fp32 = torch.nn.Linear(8, 4)
    trained = torch.nn.Linear(8, 4, dtype=torch.bfloat16)
    with cpu_few_row_linear(fp32, trained, enabled={1: "packed", 2: "packed"}):
        fp32(torch.randn(2, 8))
        trained(torch.randn(2, 8, dtype=torch.bfloat16)).sum().backward()
    assert packed_spy == [] and trained.weight.grad is not None


def test_a_cpu_that_cannot_pack_never_times_or_takes_the_packed_form(monkeypatch, packed_spy):
    """Where oneDNN refuses the bf16 reorder (an AVX2-only CPU), the probe says so, a bf16
    model is not timed packed, and a forward asked for the packed form runs F.linear."""
    from draftsmith import clock

    def refuse(*args):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support ...")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    fl.cpu_can_pack_bf16.cache_clear()
    try:
        assert not fl.cpu_can_pack_bf16()
        target = tiny_pair(1)[0].to(torch.bfloat16)
        seen = []
        monkeypatch.setattr(
            clock, "time_step", lambda name, run, sync: (seen.append(name), run(), 1.0)[-1]
        )
        fl.choose_linear_forms(target, [5, 6, 7, 8], [1, 2], repeats=2)
        assert seen and not any(name.startswith("packed") for name in seen)
        lin = torch.nn.Linear(8, 4, dtype=torch.bfloat16)
        x = torch.randn(2, 8, dtype=torch.bfloat16)
        with torch.no_grad(), cpu_few_row_linear(lin, enabled={2: "packed"}):
            got = lin(x)
        assert packed_spy == []
        torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias))
    finally:
        fl.cpu_can_pack_bf16.cache_clear()  # the next test asks the real op again


def test_linear_forms_reads_json_keys_and_refuses_unknown_forms():
    assert fl.linear_forms({"1": "packed", "3": "W@x^T"}) == {1: "packed", 3: "W@x^T"}
    assert fl.linear_forms([2, 3]) == {2: "W@x^T", 3: "W@x^T"}
    assert fl.linear_forms(False) == {}
    with pytest.raises(ValueError, match="unknown linear form"):
        fl.linear_forms({"2": "W@x"})


@needs_packing
@pytest.mark.parametrize("k", [1, 3])
def test_engine_tokens_do_not_depend_on_the_packed_form(k, packed_spy):
    """A bf16 pair decodes the same tokens, with the same acceptance, with every width on
    packed weights as with F.linear, and the packed form is really taken."""
    target, draft = (m.to(torch.bfloat16) for m in tiny_pair(3, noise=0.3))
    packed = {w: "packed" for w in range(1, k + 2)}
    runs = [
        SpeculativeDecoder(target, draft, k=k, eos_ids=[2], linear_forms=forms).generate(
            [5, 7, 11, 13], 24
        )
        for forms in (False, packed)
    ]
    assert runs[1].tokens == runs[0].tokens
    assert (runs[1].proposed, runs[1].accepted) == (runs[0].proposed, runs[0].accepted)
    assert runs[0].accepted > 0
    assert {rows for rows, _ in packed_spy} >= {1, k + 1}
    fl.drop_packed(target, draft)


@pytest.mark.gpu
def test_on_cuda_forwards_keep_f_linear_and_decoding_stays_lossless(spy):
    target, draft = (m.cuda() for m in tiny_pair(3, noise=0.3))
    prompt = [5, 7, 11, 13]
    spec = SpeculativeDecoder(target, draft, k=3, eos_ids=[2]).generate(prompt, 24)
    base = SpeculativeDecoder(target, None, eos_ids=[2]).generate(prompt, 24)
    assert spy == []  # CUDA inputs never take the few-row path
    assert spec.tokens == base.tokens and spec.accepted > 0  # float64: no near-tie flips
