"""Scoring existing text: one teacher-forced forward gives the rows decoding would record."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from draftsmith.data.hf_backend import decode_batch, score_batch
from draftsmith.models import build_byte_tokenizer, tiny_llama_config
from draftsmith.sampling import SamplingConfig


def test_scoring_the_targets_own_output_reproduces_its_decoding_topk():
    tok = build_byte_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(len(tok), num_hidden_layers=2)).eval()
    prompts = [tok(t)["input_ids"] for t in ("hello", "the quick brown fox", "a")]
    decoded = decode_batch(
        model, prompts, max_new_tokens=8, sampling=SamplingConfig(), eos_ids={2}, pad_id=0, topk=5
    )
    scored = score_batch(
        model, [(p, c.token_ids) for p, c in zip(prompts, decoded)], pad_id=0, topk=5
    )
    for d, s in zip(decoded, scored):
        assert s.token_ids == d.token_ids and s.finish_reason == "reference"
        assert s.topk_ids == d.topk_ids
        assert torch.allclose(
            torch.tensor(s.topk_logprobs), torch.tensor(d.topk_logprobs), atol=1e-5
        )


def test_scored_rows_are_the_full_softmax_at_each_reply_position():
    torch.manual_seed(1)
    model = LlamaForCausalLM(tiny_llama_config(40, num_hidden_layers=1)).eval()
    prompt, reply = [3, 4, 5], [9, 1, 7, 7]
    (c,) = score_batch(model, [(prompt, reply)], pad_id=0, topk=40)
    with torch.no_grad():
        full = model(torch.tensor([prompt + reply])).logits[0].log_softmax(-1)  # (7, 40)
    for j in range(len(reply)):  # position len(prompt) - 1 + j predicts reply[j]
        want = full[len(prompt) - 1 + j]
        got = torch.full((40,), float("nan"))
        got[torch.tensor(c.topk_ids[j])] = torch.tensor(c.topk_logprobs[j])
        assert torch.allclose(got, want, atol=1e-5)
