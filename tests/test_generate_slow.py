"""SmolLM2-135M-Instruct on 4 prompts: batching does not change greedy text; EOS policy holds."""

from __future__ import annotations

import pytest
import torch

from draftsmith.config import DataConfig, PromptSource
from draftsmith.data.hf_backend import HFBackend
from draftsmith.data.sources import encode, load_source, render
from draftsmith.models import load_model, load_tokenizer


@pytest.mark.slow
def test_smollm2_batched_equals_single_and_stops_at_eos():
    tok = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct", device=torch.device("cpu"), dtype=torch.float32)
    prompts = [
        encode(render(p, tok, True, None), tok, templated=True)
        for p in load_source(PromptSource(builtin="draftsmith", limit=4), seed=0)
    ]
    assert all(p[0] == tok.convert_tokens_to_ids("<|im_start|>") for p in prompts)
    cfg = dict(max_new_tokens=32, topk_logprobs=4)
    batched = HFBackend(model, tok, DataConfig(batch_size=4, **cfg)).generate(prompts, seed=0)
    single = HFBackend(model, tok, DataConfig(batch_size=1, **cfg)).generate(prompts, seed=0)
    eos = HFBackend(model, tok, DataConfig()).eos_ids
    for b, s in zip(batched, single):
        b, s = b[0], s[0]
        assert b.token_ids == s.token_ids
        assert torch.allclose(
            torch.tensor(b.topk_logprobs), torch.tensor(s.topk_logprobs), atol=1e-3
        )
        assert not set(b.token_ids[:-1]) & eos  # nothing after an EOS
        assert (b.token_ids[-1] in eos) == (b.finish_reason == "stop")
        assert len(b.token_ids) <= 32 and "<|im_end|>" not in tok.decode(
            b.token_ids, skip_special_tokens=True
        )
