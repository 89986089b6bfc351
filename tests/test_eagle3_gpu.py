"""GPU checks of the eagle3 kind (marked `gpu`: skipped without CUDA; scripts/gpu_check.sh runs them).

- vLLM serves an export with its `eagle3` method: greedy output equals target-only output
  and the speculative path actually ran (vLLM >= 0.15.0; skipped where vLLM is missing).
- the native engine drafts with an eagle3 head on CUDA: greedy output equals the target's.

Written against vLLM's documented offline API: `LLM(model=target, speculative_config={"method":
"eagle3", "model": <dir>, "num_speculative_tokens": k})`, `SamplingParams`, `LLM.generate`
with `TokensPrompt`, and `LLM.get_metrics()` (vllm:spec_decode_num_draft_tokens, read by vllm_backend.spec_counts).
"""

from __future__ import annotations

import gc

import pytest
import torch

from draftsmith.kinds.eagle3.head import Eagle3Head
from draftsmith.kinds.eagle3.vocab import build_draft_vocab

AUX = [1, 2, 3]  # tiny-random-llama has 4 layers
PROMPTS = [[1, 72, 101, 108, 108, 111], [1, 100, 101, 102, 32, 97, 100, 100, 40]]


def _head(target_dir, device="cpu"):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device)
    V = target.config.vocab_size
    counts = torch.arange(V, 0, -1)  # the lowest 128 ids
    torch.manual_seed(0)
    head = Eagle3Head.from_target(target, build_draft_vocab(counts, 128, V), AUX).eval()
    return target.eval(), head


@pytest.mark.gpu
def test_native_engine_drafts_with_an_eagle3_head_on_cuda(tiny_model_dir):
    from draftsmith.evaluate.engine import SpeculativeDecoder
    from draftsmith.kinds.eagle3.proposer import Eagle3Proposer

    target, head = _head(tiny_model_dir, "cuda")
    for prompt in PROMPTS:
        ref = SpeculativeDecoder(target).generate(prompt, 32).tokens
        spec = SpeculativeDecoder(target, Eagle3Proposer(head), k=3).generate(prompt, 32)
        assert spec.tokens == ref
        assert spec.proposed > 0 and spec.draft_1tok_n > 0


def _generate(vllm, llm, n: int) -> list[list[int]]:
    from vllm.inputs import TokensPrompt

    params = vllm.SamplingParams(temperature=0.0, max_tokens=n)
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    return [list(r.outputs[0].token_ids) for r in out]


def _release(llm) -> None:
    del llm
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_vllm_serves_the_eagle3_export_losslessly(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    from draftsmith.evaluate.vllm_backend import spec_counts
    from draftsmith.kinds.eagle3.export import save_eagle3
    from draftsmith.vllm_compat import import_vllm

    vllm = import_vllm("test")
    target, head = _head(tiny_model_dir)
    out = save_eagle3(
        head, tmp_path / "eagle3", target.config, str(tiny_model_dir), k=3, include_embeddings=True
    )
    common = dict(model=str(tiny_model_dir), gpu_memory_utilization=0.3, max_model_len=512)
    plain = vllm.LLM(**common, disable_log_stats=False)
    ref = _generate(vllm, plain, 24)
    _release(plain)
    spec = {"method": "eagle3", "model": str(out), "num_speculative_tokens": 3}
    llm = vllm.LLM(**common, speculative_config=spec, disable_log_stats=False)
    got = _generate(vllm, llm, 24)
    drafted = spec_counts(llm.get_metrics(), 3)["num_draft_tokens"]
    _release(llm)
    assert got == ref
    assert drafted > 0  # the eagle3 head proposed tokens: the speculative path ran
