"""The vLLM backend (`data.backend: vllm`): the same rows as the HF backend, from `vllm.LLM`.

vLLM is imported only when this backend is built; without it the user gets one
clear line. Everything around the engine call (sampling params, converting
RequestOutputs to `Completion`s) is plain Python and tested on CPU with fakes.

Top-k log-probs: `SamplingParams(logprobs=k)` returns, per generated token, a
dict {token_id: Logprob(logprob, rank, ...)} holding the top k plus the sampled
token; we keep the k best by rank. vLLM reports raw log-probs (before
temperature and top-p; its default `logprobs_mode="raw_logprobs"`), which is the
temperature-1 distribution the HF backend stores too.
"""

from __future__ import annotations

from collections.abc import Callable

from draftsmith.config import Config, DataConfig
from draftsmith.data.completion import Completion, cut_at_eos
from draftsmith.errors import DraftsmithError
from draftsmith.vllm_compat import engine_kwargs, import_vllm


def sampling_kwargs(dcfg: DataConfig, seed: int, eos_ids: set[int]) -> dict:
    kw = dict(
        n=dcfg.n,
        temperature=dcfg.temperature,  # 0: greedy
        top_p=dcfg.top_p,
        top_k=dcfg.top_k,  # 0: off (vLLM reads 0 and -1 as "all tokens")
        max_tokens=dcfg.max_new_tokens,
        seed=seed,
        stop_token_ids=sorted(eos_ids),  # the tokenizer's EOS may differ from the model config's
    )
    if dcfg.topk_logprobs:
        kw["logprobs"] = dcfg.topk_logprobs
    return kw


def _topk_rows(step_logprobs: list[dict], k: int) -> tuple[list[list[int]], list[list[float]]]:
    """[{token_id: Logprob}] per token -> (ids, logprobs), (C, k), best first."""
    ids, vals = [], []
    for step in step_logprobs:
        best = sorted(step.items(), key=lambda kv: (-kv[1].logprob, kv[0]))[:k]
        if len(best) < k:
            raise DraftsmithError(f"vLLM returned {len(best)} log-probs for a token, expected {k}")
        ids.append([int(t) for t, _ in best])
        vals.append([float(lp.logprob) for _, lp in best])
    return ids, vals


def completions_from_outputs(outputs, k: int, eos_ids: set[int]) -> list[list[Completion]]:
    """vLLM RequestOutputs (in request order) -> per prompt, its completions (sorted by index)."""
    result = []
    for req in outputs:
        comps = []
        for out in sorted(req.outputs, key=lambda o: o.index):
            tokens = list(out.token_ids)
            length, reason = cut_at_eos(tokens, eos_ids)
            c = Completion(tokens[:length], reason)
            if k:
                if out.logprobs is None or len(out.logprobs) < length:
                    raise DraftsmithError("vLLM returned no log-probs; is logprobs=k set?")
                c.topk_ids, c.topk_logprobs = _topk_rows(list(out.logprobs)[:length], k)
            comps.append(c)
        result.append(comps)
    return result


def completions_from_prompt_logprobs(outputs, pairs, k: int) -> list[Completion]:
    """Scored replies from RequestOutputs of prompt + reply requests with prompt_logprobs=k.

    `prompt_logprobs[i]` is the distribution the target gave token i of the request given
    the tokens before it (entry 0 is None), holding the top k plus the token itself; the
    reply's token j sits at index len(prompt) + j.
    """
    result = []
    for req, (prompt, reply) in zip(outputs, pairs):
        rows = req.prompt_logprobs
        if rows is None or len(rows) < len(prompt) + len(reply):
            raise DraftsmithError("vLLM returned no prompt log-probs; is prompt_logprobs=k set?")
        c = Completion(list(reply), "reference")
        c.topk_ids, c.topk_logprobs = _topk_rows(list(rows[len(prompt) :]), k)
        result.append(c)
    return result


class VllmBackend:
    def __init__(self, cfg: Config, model_path: str, eos_ids: set[int]):
        self.vllm = import_vllm("data.backend")
        self.dcfg, self.eos_ids = cfg.data, eos_ids
        self.llm = self.vllm.LLM(**engine_kwargs(cfg, cfg.data.vllm, model_path))

    def generate(
        self,
        prompts: list[list[int]],
        seed: int,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> list[list[Completion]]:
        # One seed per request: a resumed shard samples exactly what the first try did.
        params = [
            self.vllm.SamplingParams(
                **sampling_kwargs(self.dcfg, seed * 1_000_003 + i, self.eos_ids)
            )
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": p} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        result = completions_from_outputs(outputs, self.dcfg.topk_logprobs, self.eos_ids)
        if on_batch:
            on_batch(len(prompts), sum(len(c.token_ids) for cs in result for c in cs))
        return result

    def score(
        self,
        pairs: list[tuple[list[int], list[int]]],
        on_batch: Callable[[int, int], None] | None = None,
    ) -> list[Completion]:
        """Replies scored in one prefill each: prompt + reply as the request, one token
        generated (and ignored), the target's top-k at every reply token from prompt_logprobs."""
        params = self.vllm.SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=self.dcfg.topk_logprobs
        )
        requests = [{"prompt_token_ids": p + r} for p, r in pairs]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        result = completions_from_prompt_logprobs(outputs, pairs, self.dcfg.topk_logprobs)
        if on_batch:
            on_batch(len(pairs), sum(len(r) for _, r in pairs))
        return result
