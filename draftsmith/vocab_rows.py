"""Token ids versus embedding rows: a draft on the target's row count, padding rows that never win.

A model's embedding matrix and LM head often have more rows than its tokenizer has ids
(Qwen2.5: 151665 ids, 151936 rows in the 0.5B and 152064 in the 7B), and vLLM's
`draft_model` method refuses a draft whose row count differs from the target's. A draft
whose tokenizer agrees with the target's (checked first: models.check_tokenizers_compatible)
is therefore resized to the target's row count (`match_vocab_rows`). The rows from
`token_id_count(tokenizer)` on are padding: no text ever maps to them.

How a padding row can never win, whatever training does to the weights:
- draftsmith never looks at them. The training logits (distill/teacher.py, draft and
  online target alike) and the speculative engine's logits (evaluate/engine.py) are cut to
  the tokenizer's ids before any softmax, loss, argmax or sample. This holds for any
  values of those rows, also the ones a pretrained draft or the target already carries
  past its tokenizer, and it adds no parameter (a frozen negative bias would: Llama and
  Qwen2 heads have none, so transformers and vLLM would drop or refuse it). Since the cut
  rows get no gradient, training leaves them as initialised (weight decay aside).
- a runtime that does not cut them (vLLM, transformers' assisted generation) sees padding
  rows set to the mean of the real rows (`fill_padding_rows`: at initialisation, and again
  at export, after training moved the real rows). With a head logit h . w (+ b), a mean
  row's logit is the mean of the real logits, never above their maximum: greedy drafting
  never proposes a padding id (barring an all-equal tie), and by Jensen
  (exp(mean) <= mean(exp)) each padding row gets at most 1/num_ids of the real rows'
  probability mass when sampling. The target verifies every drafted token, so even then
  the output is the target's own; a padding proposal only costs a rejected slot.
"""

from __future__ import annotations

import torch

from draftsmith.errors import DraftsmithError


def token_id_count(tokenizer) -> int:
    """How many ids the tokenizer can produce: its largest id + 1 (added tokens included)."""
    return max(tokenizer.get_vocab().values()) + 1


def vocab_rows(lm) -> int:
    return lm.get_input_embeddings().weight.shape[0]


def _row_tensors(lm) -> list[torch.Tensor]:
    """The embedding weight, the head weight (once if tied) and the head bias, if any."""
    out = {}
    head = lm.get_output_embeddings()
    for t in (lm.get_input_embeddings().weight, getattr(head, "weight", None)):
        if t is not None:
            out[t.data_ptr()] = t
    bias = getattr(head, "bias", None)
    if bias is not None:
        out[bias.data_ptr()] = bias
    return list(out.values())


@torch.no_grad()
def fill_padding_rows(lm, num_ids: int) -> None:
    """Set every embedding/head row (and head bias) from `num_ids` on to the mean of the rows before."""
    for t in _row_tensors(lm):
        if t.shape[0] > num_ids:
            t[num_ids:] = t[:num_ids].float().mean(0).to(t.dtype)


def match_vocab_rows(lm, rows: int, num_ids: int, key: str = "draft.model") -> None:
    """Resize the embeddings and head to `rows` (padding or trimming padding only), then fill.

    `lm.config.vocab_size` follows, so the saved model has the target's vocabulary size.
    """
    if rows < num_ids:
        raise DraftsmithError(
            f"{key}: the target has {rows} vocabulary rows but the tokenizer uses {num_ids} ids"
        )
    if vocab_rows(lm) != rows:
        lm.resize_token_embeddings(rows, mean_resizing=False)
    fill_padding_rows(lm, num_ids)
