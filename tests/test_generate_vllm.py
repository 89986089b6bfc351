"""The vLLM backend: everything around the engine on CPU with fake outputs; the engine on GPU."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from draftsmith.config import load_config
from draftsmith.data.vllm_backend import (
    completions_from_outputs,
    completions_from_prompt_logprobs,
    sampling_kwargs,
)
from draftsmith.errors import DraftsmithError
from draftsmith.vllm_compat import engine_kwargs, import_vllm

REPO = Path(__file__).resolve().parents[1]


def lp(value: float, rank: int):
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=None)


def fake_output(index, token_ids, logprobs=None, finish_reason="length"):
    return SimpleNamespace(
        index=index, token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason, text=""
    )


def test_request_outputs_become_completions_with_topk_by_rank():
    # token 2 is EOS; vLLM adds the sampled token to the top-k dict when it is outside it
    steps = [
        {5: lp(-0.1, 1), 7: lp(-2.5, 2), 9: lp(-3.0, 3)},
        {9: lp(-5.0, 4), 6: lp(-0.3, 1), 5: lp(-1.9, 2), 8: lp(-2.0, 3)},  # 9 sampled, rank 4
        {2: lp(-0.2, 1), 3: lp(-2.2, 2), 4: lp(-4.0, 3)},
    ]
    req = SimpleNamespace(
        prompt_token_ids=[1, 2, 3],
        outputs=[fake_output(1, [7, 7], None), fake_output(0, [5, 9, 2], steps, "stop")],
    )
    req.outputs[0].logprobs = [dict(steps[0]), dict(steps[0])]
    (comps,) = completions_from_outputs([req], k=2, eos_ids={2})
    first, second = comps  # sorted by output index
    assert first.token_ids == [5, 9, 2] and first.finish_reason == "stop"
    assert first.topk_ids == [[5, 7], [6, 5], [2, 3]]
    assert first.topk_logprobs == [[-0.1, -2.5], [-0.3, -1.9], [-0.2, -2.2]]
    assert second.token_ids == [7, 7] and second.finish_reason == "length"


def test_prompt_logprobs_become_scored_replies():
    # request = prompt [1, 2] + reply [5, 9]; entry i scores token i given the ones before it
    rows = [
        None,
        {2: lp(-0.5, 1), 3: lp(-1.0, 2)},
        {5: lp(-0.2, 1), 6: lp(-2.0, 2), 7: lp(-3.0, 3)},
        {9: lp(-4.0, 3), 8: lp(-0.1, 1), 5: lp(-2.5, 2)},  # the reply's token ranked 3rd
    ]
    req = SimpleNamespace(prompt_logprobs=rows, outputs=[fake_output(0, [4])])
    (c,) = completions_from_prompt_logprobs([req], [([1, 2], [5, 9])], k=2)
    assert c.token_ids == [5, 9] and c.finish_reason == "reference"
    assert c.topk_ids == [[5, 6], [8, 5]] and c.topk_logprobs == [[-0.2, -2.0], [-0.1, -2.5]]
    short = SimpleNamespace(prompt_logprobs=rows[:3], outputs=[])
    with pytest.raises(DraftsmithError, match="no prompt log-probs"):
        completions_from_prompt_logprobs([short], [([1, 2], [5, 9])], k=2)


def test_tokens_after_eos_are_dropped_and_missing_logprobs_are_an_error():
    req = SimpleNamespace(outputs=[fake_output(0, [4, 2, 0, 0])])
    (comps,) = completions_from_outputs([req], k=0, eos_ids={2})
    assert comps[0].token_ids == [4, 2] and comps[0].topk_ids is None
    with pytest.raises(DraftsmithError, match="no log-probs"):
        completions_from_outputs([req], k=3, eos_ids={2})


def test_engine_and_sampling_arguments_follow_the_config():
    cfg = load_config(
        REPO / "configs" / "tiny.yaml",
        [
            "data.backend=vllm",
            "data.vllm.tensor_parallel_size=2",
            "data.vllm.max_model_len=2048",
            "target.dtype=bfloat16",
            "data.temperature=0.7",
            "data.top_p=0.95",
            "data.n=3",
        ],
    )
    kw = engine_kwargs(cfg, cfg.data.vllm, "/models/t")
    assert kw["model"] == "/models/t" and kw["tensor_parallel_size"] == 2
    assert kw["dtype"] == "bfloat16" and kw["max_model_len"] == 2048
    sp = sampling_kwargs(cfg.data, seed=11, eos_ids={2, 5})
    assert sp == dict(
        n=3,
        temperature=0.7,
        top_p=0.95,
        top_k=0,
        max_tokens=16,
        seed=11,
        stop_token_ids=[2, 5],
        logprobs=8,
    )


def test_missing_vllm_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(
        DraftsmithError, match="data.backend: 'vllm' needs vLLM >= 0.15.0, which is not installed"
    ):
        import_vllm("data.backend")


def test_stage_with_vllm_backend_fails_before_writing(monkeypatch, tmp_path, tiny_model_dir):
    from draftsmith.data.generate import run_generate

    monkeypatch.setitem(sys.modules, "vllm", None)
    out = tmp_path / "run"
    cfg = load_config(
        REPO / "configs" / "tiny.yaml", [f"run.output_dir={out}", "data.backend=vllm"]
    )
    with pytest.raises(DraftsmithError, match="needs vLLM"):
        run_generate(cfg)
    assert not (out / "data").exists()


@pytest.mark.gpu
def test_vllm_greedy_matches_hf_greedy(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from draftsmith.data import load_train_dataset
    from draftsmith.data.generate import run_generate

    common = ["data.max_new_tokens=8", "target.dtype=float32", "data.topk_logprobs=4"]
    runs = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        run_generate(
            load_config(
                REPO / "configs" / "tiny.yaml",
                [f"run.output_dir={out}", f"data.backend={backend}", *common],
            )
        )
        runs[backend] = load_train_dataset(out)
    hf, vl = runs["hf"], runs["vllm"]
    assert hf["prompt_ids"] == vl["prompt_ids"]
    same = sum(a == b for a, b in zip(hf["completion_ids"], vl["completion_ids"]))
    assert same >= 0.9 * len(hf)  # kernels differ; near-ties may flip a few greedy choices
