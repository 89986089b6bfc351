"""MT-bench turn 2: the second question, asked after the target's own answer to the first.

An eval prompt whose record carries `followups` (MT-bench's turn 2, data/sources.py) becomes,
in the eval set `<set>-turn2`, the conversation [turn 1, the target's answer to turn 1,
turn 2], rendered and tokenized exactly as generate renders prompts (data.chat_template,
data.system_prompt). The answer is the target's own greedy one, at most
evaluate.turn2_answer_tokens long and cut at EOS, written at evaluation time by the data
stage's batched decoder (data/hf_backend.py); the stage caches it (eval/results/turn1-answers-*).
"""

from __future__ import annotations

import dataclasses

from draftsmith.config import Config
from draftsmith.data.hf_backend import HFBackend
from draftsmith.data.prepare import encode_all
from draftsmith.data.sources import Prompt

SUFFIX = "-turn2"


def asked_again(prompts: list[dict]) -> list[dict]:
    """The prompts that have a second turn to ask (and the conversation to ask it in)."""
    return [p for p in prompts if p.get("followups") and p.get("messages")]


def target_answers(target, tokenizer, cfg: Config, prompts: list[dict]) -> list[list[int]]:
    """The target's greedy answer to each prompt (token ids, EOS included when emitted)."""
    dcfg = dataclasses.replace(
        cfg.data,
        temperature=0.0,
        n=1,
        topk_logprobs=0,
        max_new_tokens=cfg.evaluate.turn2_answer_tokens,
    )
    comps = HFBackend(target, tokenizer, dcfg).generate([p["prompt_ids"] for p in prompts], 0)
    return [c[0].token_ids for c in comps]


def turn2_prompts(
    prompts: list[dict], answers: list[str], cfg: Config, tokenizer, max_tokens: int | None
) -> tuple[list[dict], int]:
    """(turn-2 eval records, how many were over `max_tokens` and left out)."""
    out, too_long = [], 0
    for p, answer in zip(prompts, answers):
        msgs = (*map(tuple, p["messages"]), ("assistant", answer), ("user", p["followups"][0]))
        (enc,) = encode_all([Prompt(msgs, p["category"], p.get("source", ""))], cfg, tokenizer)
        if max_tokens is not None and len(enc.ids) > max_tokens:
            too_long += 1
            continue
        out.append(
            {
                "id": f"{p['id']}{SUFFIX}",
                "prompt_text": enc.text,
                "prompt_ids": enc.ids,
                "category": p["category"],
                "source": p.get("source"),
                "eval_set": p["eval_set"] + SUFFIX,
                "followups": [],
            }
        )
    return out, too_long
