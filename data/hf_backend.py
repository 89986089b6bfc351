"""The `transformers` backend: a batched decode loop over the model's forward, bucketed by length.

Why not `model.generate`: on a CPU, profiling SmolLM2-135M at batch 32 showed a quarter
of generate's time in torch.cat growing the KV cache and every finished row decoded on
as padding until the whole batch ends. This loop keeps the cache in preallocated buffers
(draftsmith/kv_cache.py) and drops a row from the batch as soon as it emits EOS, so the
batch shrinks as rows finish. Greedy output equals `generate`'s (tested); sampling uses
the same temperature/top-k/top-p rule as the speculative engine (draftsmith/sampling.py)
with a per-batch seeded generator, so a resumed shard repeats its samples.

Prompts are sorted by length before batching so each batch pads little; the results come
back in the caller's order. Top-k teacher log-probs come from the same forward passes that
decode (the raw logits, before temperature/top-p), log-softmaxed at temperature 1 -- no
second pass.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from draftsmith.config import DataConfig
from draftsmith.data.completion import Completion
from draftsmith.fast_linear import F_LINEAR, FEW_ROW, cpu_few_row_linear, few_row_counts
from draftsmith.kv_cache import cache_kwarg, new_cache
from draftsmith.models import eos_token_ids
from draftsmith.sampling import SamplingConfig, sampling_probs


def length_buckets(
    lengths: list[int], batch_size: int, max_tokens: int | None = None, extra: int = 0
) -> list[list[int]]:
    """Indices grouped into batches of similar length (stable sort, so deterministic).

    With `max_tokens`, a batch also stops growing before rows x (its longest length + extra)
    would pass it: every decode step reads the whole KV cache, so long prompts get smaller
    batches (one row always fits).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = [[]]
    for i in order:
        rows = len(batches[-1]) + 1
        full = rows > batch_size or (
            max_tokens is not None and rows * (lengths[i] + extra) > max_tokens
        )
        if full and batches[-1]:
            batches.append([])
        batches[-1].append(i)
    return [b for b in batches if b]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T), padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids, mask


class _Rows:
    """The rows still decoding: their original index, mask, next position and outputs."""

    def __init__(self, mask: torch.Tensor, topk: int):
        n = mask.shape[0]
        self.index = list(range(n))  # live row j is original row index[j]
        self.mask = mask  # (B', T) attention mask of the live rows
        self.next_pos = mask.sum(-1)  # (B',) position id of each row's next token
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.topk_ids: list[list[list[int]]] | None = [[] for _ in range(n)] if topk else None
        self.topk_lps: list[list[list[float]]] | None = [[] for _ in range(n)] if topk else None

    def record(self, chosen: list[int], top: tuple[torch.Tensor, torch.Tensor] | None):
        ids, lps = (top[1].tolist(), top[0].tolist()) if top is not None else (None, None)
        for j, r in enumerate(self.index):
            self.tokens[r].append(chosen[j])
            if ids is not None:
                self.topk_ids[r].append(ids[j])
                self.topk_lps[r].append(lps[j])

    def keep(self, live: list[int], cache) -> None:
        """Drop every row not in `live` (positions in the current batch) from batch and cache."""
        idx = torch.tensor(live, device=self.mask.device)
        cache.batch_select_indices(idx)
        self.index = [self.index[j] for j in live]
        self.mask, self.next_pos = self.mask[idx], self.next_pos[idx]


@torch.no_grad()
def decode_batch(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_ids: set[int],
    pad_id: int,
    topk: int = 0,
    generator: torch.Generator | None = None,
) -> list[Completion]:
    """Decode every prompt (left-padded into one batch) -> one Completion per prompt."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id)  # (B, P)
    ids, mask = ids.to(device), mask.to(device)
    cache, kw = new_cache(model), cache_kwarg(model)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)  # padding's positions are masked anyway
    logits = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        logits_to_keep=1,
        **{kw: cache},
    ).logits[:, -1]  # (B, V)
    rows = _Rows(mask, topk)
    for step in range(max_new_tokens):
        if sampling.greedy:
            chosen = logits.argmax(-1)  # (B',)
        else:
            probs = sampling_probs(logits, sampling)
            chosen = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        top = torch.log_softmax(logits.float(), -1).topk(topk, -1) if topk else None
        picked = chosen.tolist()
        rows.record(picked, top)
        live = [j for j, t in enumerate(picked) if t not in eos_ids]
        if not live or step == max_new_tokens - 1:
            break
        if len(live) < len(picked):
            rows.keep(live, cache)
            chosen = chosen[torch.tensor(live, device=device)]
        rows.mask = torch.cat([rows.mask, rows.mask.new_ones(len(live), 1)], -1)
        logits = model(
            input_ids=chosen[:, None],
            attention_mask=rows.mask,
            position_ids=rows.next_pos[:, None],
            use_cache=True,
            logits_to_keep=1,
            **{kw: cache},
        ).logits[:, -1]
        rows.next_pos = rows.next_pos + 1
    out = []
    for r, toks in enumerate(rows.tokens):
        c = Completion(toks, "stop" if toks and toks[-1] in eos_ids else "length")
        if topk:
            c.topk_ids, c.topk_logprobs = rows.topk_ids[r], rows.topk_lps[r]
        out.append(c)
    return out


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T), padded on the right (no cache: positions 0..)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


@torch.no_grad()
def score_batch(
    model, pairs: list[tuple[list[int], list[int]]], *, pad_id: int, topk: int
) -> list[Completion]:
    """Teacher-forced scoring: the target's top-k log-probs at every reply token, one forward.

    pairs: (prompt_ids, reply_ids). The sequence prompt + reply[:-1] is fed once; position
    len(prompt) - 1 + j predicts reply token j, so the C reply tokens get their teacher rows
    from the last C positions, exactly as `decode_batch` records them while writing. The head
    runs only on those positions: (N, H) @ (H, V), never a (B, T, V) tensor.
    """
    device = next(model.parameters()).device
    ids, mask = right_pad([p + r[:-1] for p, r in pairs], pad_id)  # (B, T)
    body = getattr(model, model.base_model_prefix)
    hidden = body(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    pick = torch.zeros_like(mask, dtype=torch.bool)  # (B, T): positions predicting a reply token
    for b, (p, r) in enumerate(pairs):
        pick[b, len(p) - 1 : len(p) - 1 + len(r)] = True
    logits = model.get_output_embeddings()(hidden[pick.to(device)])  # (N, V)
    top = torch.log_softmax(logits.float(), -1).topk(topk, -1)  # (N, k) each
    ids_rows, lp_rows = top.indices.tolist(), top.values.tolist()
    out, at = [], 0
    for _, r in pairs:
        c = Completion(list(r), "reference")
        c.topk_ids, c.topk_logprobs = ids_rows[at : at + len(r)], lp_rows[at : at + len(r)]
        out.append(c)
        at += len(r)
    return out


def timed_widths(batch_size: int) -> list[int]:
    """The decode widths whose linear-layer form is timed: 1, 2, 4, ... and batch_size."""
    return sorted(
        {2**i for i in range(batch_size.bit_length()) if 2**i <= batch_size} | {batch_size}
    )


def forms_by_width(chosen: dict, timed: list[int]) -> dict[int, str]:
    """{rows: form} for every decode width 1..max(timed) from the timed widths' choice
    ({width as str: form}, F.linear where absent): a width takes the choice of the widest timed
    width at or below it (a batch shrinks from batch_size as its rows finish)."""
    batch_size = max(timed)
    forms = {}
    for w in range(1, batch_size + 1):
        anchor = max(t for t in timed if t <= w)
        form = chosen.get(str(anchor), F_LINEAR)
        if form != F_LINEAR:
            forms[w] = form
    return forms


def decode_linear_forms(
    model, dcfg: DataConfig, vocab: int, record: Path | None = None, target_key: str = ""
) -> dict[int, str]:
    """{rows: form} for the target's linear layers in decode steps (data.cpu_few_row_linear).

    A decode step multiplies every weight by one row per live sequence, the few-row shape
    where F.linear can run well below the CPU's speed (draftsmith/fast_linear.py). auto:
    each form timed on the target at the widths timed_widths names (evaluate's
    choose_linear_forms, a 128-token context) and the fastest taken per width; prefills and
    scoring (hundreds of rows) keep F.linear. GPUs keep F.linear.

    The choice is kept in `record` (the run's data dir) with what it was timed for (target,
    dtype, machine, widths): a resumed generate on the same machine takes the same forms, so
    its shards round like the killed run's rather than like a fresh timing's pick.
    """
    setting = dcfg.cpu_few_row_linear
    if next(model.parameters()).device.type != "cpu" or setting is False:
        return {}
    width = dcfg.batch_size
    if setting is not True:
        from draftsmith.fast_linear import choose_linear_forms
        from draftsmith.io import cached_json
        from draftsmith.models import hardware

        timed, timed_now = timed_widths(width), []

        def time_forms() -> dict:
            timed_now.append(True)
            context = [t % vocab for t in range(1000, 1128)]  # the cost does not depend on values
            return {"forms": choose_linear_forms(model, context, timed, repeats=3)["forms"]}

        dtype = str(next(model.parameters()).dtype)
        settings = {"target": target_key, "dtype": dtype, "hardware": hardware(), "widths": timed}
        data = time_forms() if record is None else cached_json(record, settings, time_forms)
        chosen = data["forms"]
        how = "timed" if timed_now else f"as timed before on this machine ({record.name})"
        print(
            f"generate: the target's linear layers by decode width ({how} faster than "
            f"F.linear): {', '.join(f'{w}: {f}' for w, f in chosen.items()) or 'none'} of "
            f"widths {timed}; F.linear elsewhere"
        )
        return forms_by_width(chosen, timed)
    return {w: FEW_ROW for w in few_row_counts(True) if w <= width}


class HFBackend:
    """Generates for a list of prompt-id lists; `n` completions per prompt. `linear_forms`
    ({rows: form}, decode_linear_forms) is what the target's linear layers take in decode."""

    def __init__(self, model, tokenizer, dcfg: DataConfig, linear_forms: dict | None = None):
        self.model, self.dcfg = model, dcfg
        self.linear_forms = linear_forms or {}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = eos_token_ids(tokenizer, model.generation_config)
        self.sampling = SamplingConfig(dcfg.temperature, dcfg.top_p, dcfg.top_k)

    def generate_batch(self, prompts: list[list[int]], seed: int) -> list[list[Completion]]:
        """One padded batch -> per prompt, its n completions (rows prompt-major)."""
        n = self.dcfg.n
        generator = None
        if not self.sampling.greedy:  # seeded per batch, so a resumed shard repeats its samples
            device = next(self.model.parameters()).device
            generator = torch.Generator(device=device).manual_seed(seed)
        with cpu_few_row_linear(self.model, enabled=self.linear_forms):
            rows = decode_batch(
                self.model,
                [p for p in prompts for _ in range(n)],
                max_new_tokens=self.dcfg.max_new_tokens,
                sampling=self.sampling,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                topk=self.dcfg.topk_logprobs,
                generator=generator,
            )
        return [rows[i * n : (i + 1) * n] for i in range(len(prompts))]

    def generate(
        self,
        prompts: list[list[int]],
        seed: int,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> list[list[Completion]]:
        """All prompts, bucketed by length; `on_batch(prompts_done, new_tokens)` after each batch."""
        n = self.dcfg.n
        per_batch = max(1, self.dcfg.batch_size // n)  # batch_size counts sequences
        cap = self.dcfg.max_batch_tokens
        buckets = length_buckets(
            [len(p) for p in prompts],
            per_batch,
            None if cap is None else max(1, cap // n),
            self.dcfg.max_new_tokens,
        )
        results: list[list[Completion] | None] = [None] * len(prompts)
        for b, idx in enumerate(buckets):
            got = self.generate_batch([prompts[i] for i in idx], seed=seed * 1_000_003 + b)
            for i, comps in zip(idx, got):
                results[i] = comps
            if on_batch:
                on_batch(len(idx), sum(len(c.token_ids) for cs in got for c in cs))
        return results

    def score(
        self,
        pairs: list[tuple[list[int], list[int]]],
        on_batch: Callable[[int, int], None] | None = None,
    ) -> list[Completion]:
        """Existing replies scored by the target, bucketed by length like `generate`."""
        cap = self.dcfg.max_batch_tokens
        lengths = [len(p) + len(r) for p, r in pairs]
        buckets = length_buckets(lengths, self.dcfg.batch_size, cap)
        results: list[Completion | None] = [None] * len(pairs)
        for idx in buckets:
            got = score_batch(
                self.model,
                [pairs[i] for i in idx],
                pad_id=self.pad_id,
                topk=self.dcfg.topk_logprobs,
            )
            for i, c in zip(idx, got):
                results[i] = c
            if on_batch:
                on_batch(len(idx), sum(len(c.token_ids) for c in got))
        return results
