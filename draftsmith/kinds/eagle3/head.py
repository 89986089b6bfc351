"""An EAGLE-3-style draft head: one decoder layer on the target's own hidden states.

An independent draft must recompute from tokens what the target already knows; this head
reads it. For every position it takes the target's hidden states at three layers (low,
middle, high), projects them to one d-wide feature, pairs that with the embedding of the
token that comes next (the target's own embedding matrix, frozen and shared), runs one
Llama decoder layer whose attention reads both (2d wide), and predicts the token after
that over a reduced draft vocabulary (draftsmith.kinds.eagle3.vocab).

Alignment (as EAGLE, speculators and vLLM align them). For target tokens x_0..x_{N-1},
g_i = the target's aux features at position i (it has read x_0..x_i) and z_i = its
logits there (predicting x_{i+1}). Head position t (t = 0..N-2) reads

    aux_hidden[t] = g_t          (B, T, 3d), T = N - 1
    input_ids[t]  = x_{t+1}      the token the target chose after position t
    -> logits[t] predicts x_{t+2}; its teacher is z_{t+1}

(`head_inputs` does this slicing, padding mask included). Decoding keeps the same pairing: the entry for the
newest verified token x_n pairs it with g_{n-1}, and its output proposes x_{n+1}.

Training-time test (EAGLE-3): at step j > 0 position t reads the head's own output
hidden state of step j-1 at t in place of fc(g_t), with the next ground-truth token
x_{t+1+j}, at position t + j; it predicts x_{t+2+j} (teacher z_{t+1+j}). Its query
attends to step 0's keys at positions <= t and to its own and the earlier steps' keys at
t only: exactly what decoding sees after j speculative steps from position t (the cache
holds the verified entries, then one entry per speculative step). `shift_left` aligns
ids, teachers and loss masks with step j.

Aux layer ids: id i is the residual stream entering decoder layer i, which is
`hidden_states[i]` of a transformers forward with output_hidden_states=True and what
vLLM's Llama collects for id i (`aux_hidden_states.append(hidden_states + residual)`
before layer i). Default (2, n // 2, n - 3), as vLLM's `get_eagle3_aux_hidden_state_layers`
and speculators' `resolve_target_layer_ids` choose (SmolLM2-135M, 30 layers: 2, 15, 27).

The layer is always a Llama layer built from the target's widths (vLLM serves every
speculators eagle3 checkpoint as `Eagle3LlamaForCausalLM`), so the supported targets are
the Llama-shaped families: RMSNorm, rotary positions, gated MLP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.kinds.eagle3.vocab import DraftVocab, vocab_problem

# Families whose decoder a Llama layer of the same widths can stand in for.
SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low / middle / high layers: (2, n // 2, n - 3)."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) < 3 or min(ids) < 0 or max(ids) >= num_layers:
        raise ConfigError(
            f"draft.eagle3.aux_layer_ids: the default {ids} does not fit a target with {num_layers} "
            f"layers (it needs at least 7); set 3 distinct ids in [0, {num_layers - 1}]"
        )
    return ids


def check_aux_layer_ids(ids: Sequence[int], num_layers: int) -> list[int]:
    ids = [int(i) for i in ids]
    if len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0 or max(ids) >= num_layers:
        raise ConfigError(
            f"draft.eagle3.aux_layer_ids: {ids} must be 3 distinct layer ids in [0, {num_layers - 1}] "
            f"(the target has {num_layers} layers)"
        )
    return ids


def layer_config_from_target(target_config):
    """A 1-layer LlamaConfig with the target's widths; vocab_size stays the target's."""
    from transformers import LlamaConfig

    tc = target_config.get_text_config()
    family = getattr(tc, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"draft.kind: eagle3 needs a Llama-family target ({', '.join(SUPPORTED_FAMILIES)}); "
            f"this target is {family!r}"
        )
    rope = dict(getattr(tc, "rope_parameters", None) or {})
    rope_theta = rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))
    rope.setdefault("rope_type", "default")
    rope["rope_theta"] = rope_theta
    return LlamaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        hidden_act=tc.hidden_act,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps,
        initializer_range=getattr(tc, "initializer_range", 0.02),
        rope_theta=rope_theta,  # read by transformers 4.x and older vLLM
        rope_parameters=rope,  # read by transformers 5.x
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        bos_token_id=getattr(tc, "bos_token_id", None),
        eos_token_id=getattr(tc, "eos_token_id", None),
        pad_token_id=getattr(tc, "pad_token_id", None),
    )


# ----------------------------------------------------------------------------- the layer


class _Projections(nn.Module):
    """q/k/v read cat(embedding, feature) (2d wide); o writes d. Names match LlamaAttention."""

    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(2 * d, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * d, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)


class Eagle3Layer(nn.Module):
    """EAGLE-3's first decoder layer; parameter names are speculators' `layers.0.*`.

    input_layernorm normalises the token embedding, hidden_norm the feature; the residual
    is the raw feature, or the normalised one with norm_before_residual (both as in
    speculators' Eagle3FirstLayerMixin and vLLM's llama_eagle3 layer 0).
    """

    def __init__(self, cfg, norm_before_residual: bool):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.norm_before_residual = norm_before_residual
        self.self_attn = _Projections(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def qkv(self, embeds: Tensor, feature: Tensor, cos: Tensor, sin: Tensor):
        """embeds, feature (B, T, d) -> q (B, H, T, hd), k, v (B, Hkv, T, hd), residual (B, T, d)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # (B, T, 2d)
        B, T, _ = x.shape
        q = self.self_attn.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.self_attn.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.self_attn.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, residual

    def attend_and_mlp(self, q, keys, values, mask: Tensor | None, residual: Tensor) -> Tensor:
        """q (B, H, T, hd) over keys/values (B, Hkv, S, hd) with mask (.., T, S) -> (B, T, d)."""
        from transformers.models.llama.modeling_llama import repeat_kv

        groups = self.n_heads // self.n_kv
        out = F.scaled_dot_product_attention(
            q, repeat_kv(keys, groups), repeat_kv(values, groups), attn_mask=mask
        )  # (B, H, T, hd)
        B, _, T, _ = out.shape
        h = residual + self.self_attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


# ----------------------------------------------------------------------------- masks, shifts


def shift_left(x: Tensor, n: int, fill=0) -> Tensor:
    """x[:, t + n] at position t, `fill` past the end: aligns a (B, T, ...) tensor with TTT step n."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)


def head_inputs(
    target_ids: Tensor, aux_hidden: Tensor, attention_mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Target tokens (B, N), features (B, N, 3d), mask (B, N) -> the head's (B, N-1) inputs.

    Head position t pairs g_t with x_{t+1}: it is real only when both tokens are (with
    left padding the first real token's position pairs a pad feature with it).
    """
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()
    return target_ids[:, 1:], aux_hidden[:, :-1], mask


def select_aux_hidden(hidden_states: Sequence[Tensor], layer_ids: Sequence[int]) -> Tensor:
    """A transformers forward's output_hidden_states tuple -> (B, T, 3d), low to high."""
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


def _ttt_mask(attention_mask: Tensor | None, B: int, T: int, step: int, device) -> Tensor:
    """(B, 1, T, (step+1) T) bool: step 0 causal (and not padding), then own position only."""
    t = torch.arange(T, device=device)
    eye = (t[:, None] == t[None, :]).expand(B, T, T)
    causal = (t[None, :] <= t[:, None]).expand(B, T, T)
    if attention_mask is not None:
        causal = causal & attention_mask.bool()[:, None, :]
    causal = causal | eye  # a padded query still attends somewhere: no NaN rows
    return torch.cat([causal] + [eye] * step, dim=-1)[:, None]


def _positions(attention_mask: Tensor | None, B: int, T: int, device) -> Tensor:
    """(B, T) rotary positions of the step-0 entries: 0.. over the real tokens of each row."""
    if attention_mask is None:
        return torch.arange(T, device=device).expand(B, T)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# ----------------------------------------------------------------------------- the head


class HeadOutput(NamedTuple):
    logits: Tensor  # (B, T, Vd) over the draft vocabulary
    hidden: Tensor  # (B, T, d) the layer's output before the final norm: what step j+1 reads
    keys: Tensor  # (B, Hkv, T, hd) rotated keys of this step (context for later TTT steps)
    values: Tensor  # (B, Hkv, T, hd)


class Eagle3Head(nn.Module):
    """fc (3d -> d) + one Eagle3Layer + norm + lm_head (d -> Vd), with d2t/t2d buffers.

    The token embedding is the target's module, held by reference: not a parameter of
    the head, not in its state_dict, never updated (looked up under no_grad).
    """

    def __init__(
        self,
        layer_config,
        vocab: DraftVocab,
        aux_layer_ids: Sequence[int],
        norm_before_residual: bool = False,
        embed_tokens: nn.Module | None = None,
    ):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        problem = vocab_problem(vocab.d2t, vocab.t2d)
        if problem:
            raise DraftsmithError(f"draft vocabulary: {problem}")
        if vocab.t2d.numel() != layer_config.vocab_size:
            raise DraftsmithError(
                f"draft vocabulary: t2d covers {vocab.t2d.numel()} ids but the target's "
                f"vocabulary has {layer_config.vocab_size}"
            )
        self.config = layer_config
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        self.norm_before_residual = bool(norm_before_residual)
        d = layer_config.hidden_size
        self.fc = nn.Linear(3 * d, d, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(layer_config, self.norm_before_residual)])
        self.norm = LlamaRMSNorm(d, eps=layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(d, vocab.size, bias=False)
        self.register_buffer("d2t", vocab.d2t.clone())
        self.register_buffer("t2d", vocab.t2d.clone())
        self.rotary_emb = LlamaRotaryEmbedding(layer_config)  # buffers only, not saved
        self._init_weights(layer_config.initializer_range)
        self.attach_embeddings(embed_tokens)

    @classmethod
    def from_target(
        cls,
        target,
        vocab: DraftVocab,
        aux_layer_ids: Sequence[int] | None = None,
        norm_before_residual: bool = False,
        lm_head_from_target: bool = True,
    ) -> Eagle3Head:
        """A fresh head for `target` (a transformers causal LM), sharing its embeddings.

        lm_head_from_target starts the draft head from the target's own output rows for
        the draft vocabulary, as speculators initialises it (its load_verifier_weights).
        """
        cfg = layer_config_from_target(target.config)
        n = target.config.get_text_config().num_hidden_layers
        ids = default_aux_layer_ids(n) if aux_layer_ids is None else aux_layer_ids
        head = cls(
            cfg,
            vocab,
            check_aux_layer_ids(ids, n),
            norm_before_residual,
            target.get_input_embeddings(),
        )
        if lm_head_from_target:
            weight = target.get_output_embeddings().weight.detach()  # (V, d)
            head.lm_head.weight.data.copy_(weight[vocab.t2d.to(weight.device)])  # (Vd, d)
        return head.to(next(target.parameters()).device)

    def _init_weights(self, std: float) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=std)

    def attach_embeddings(self, embed_tokens: nn.Module | None) -> None:
        # object.__setattr__ keeps the module out of parameters(), state_dict() and .to()
        object.__setattr__(self, "embed_tokens", embed_tokens)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def vocab(self) -> DraftVocab:
        return DraftVocab(self.d2t, self.t2d)

    # -- pieces ---------------------------------------------------------------------------

    def _embed(self, input_ids: Tensor) -> Tensor:
        if self.embed_tokens is None:
            raise DraftsmithError(
                "eagle3 head has no token embeddings: attach the target's with "
                "head.attach_embeddings(target.get_input_embeddings())"
            )
        with torch.no_grad():
            return self.embed_tokens(input_ids).to(self.fc.weight.dtype)  # (B, T, d)

    def _feature(self, aux_hidden: Tensor | None, prev_hidden: Tensor | None) -> Tensor:
        if (aux_hidden is None) == (prev_hidden is None):
            raise ValueError("pass exactly one of aux_hidden (target features) or prev_hidden")
        if aux_hidden is not None:
            return self.fc(aux_hidden.to(self.fc.weight.dtype))  # (B, T, 3d) -> (B, T, d)
        return prev_hidden  # (B, T, d)

    def _rope(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rotary_emb(x, positions)  # cos, sin (B, T, hd)

    # -- (a) training ---------------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        aux_hidden: Tensor | None = None,
        prev_hidden: Tensor | None = None,
        attention_mask: Tensor | None = None,
        context: Sequence[HeadOutput] = (),
    ) -> HeadOutput:
        """One drafting step over whole sequences (step j = len(context)).

        Step 0: aux_hidden (B, T, 3d) = g_t, input_ids (B, T) = x_{t+1}, attention_mask
        (B, T) 1 on real tokens (either padding side). Step j > 0: prev_hidden = step
        j-1's `hidden`, input_ids = shift_left(step-0 ids, j), context = the outputs of
        steps 0..j-1. Returns logits (B, T, Vd) and the state for step j+1.
        """
        B, T = input_ids.shape
        step = len(context)
        layer = self.layers[0]
        feature = self._feature(aux_hidden, prev_hidden)
        positions = _positions(attention_mask, B, T, input_ids.device) + step
        q, k, v, residual = layer.qkv(
            self._embed(input_ids), feature, *self._rope(feature, positions)
        )
        keys = torch.cat([c.keys for c in context] + [k], dim=2)  # (B, Hkv, (step+1) T, hd)
        values = torch.cat([c.values for c in context] + [v], dim=2)
        mask = _ttt_mask(attention_mask, B, T, step, input_ids.device)
        hidden = layer.attend_and_mlp(q, keys, values, mask, residual)  # (B, T, d)
        return HeadOutput(self.lm_head(self.norm(hidden)), hidden, k, v)

    def unroll(
        self,
        aux_hidden: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        steps: int,
    ) -> list[HeadOutput]:
        """Training-time test: `steps` drafting steps, step j reading step j-1's own state.

        outputs[j].logits[:, t] predicts x_{t+2+j}: align teachers and loss masks with
        shift_left(step-0 tensor, j); the last j positions of step j have no target.
        """
        outs = [self(input_ids, aux_hidden=aux_hidden, attention_mask=attention_mask)]
        for j in range(1, steps):
            outs.append(
                self(
                    shift_left(input_ids, j),
                    prev_hidden=outs[-1].hidden,
                    attention_mask=attention_mask,
                    context=outs,
                )
            )
        return outs

    # -- (b) decoding with a KV cache -------------------------------------------------------

    def new_cache(self):
        """An empty KV cache for step(): croppable like the engine's (crop(-n) drops n)."""
        from draftsmith.kv_cache import new_cache

        return new_cache(self)  # self.config: one full-attention layer

    def step(
        self,
        cache,
        input_ids: Tensor,
        aux_hidden: Tensor | None = None,
        prev_hidden: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Append n entries (B, n) to `cache`; return the last one's logits (B, Vd) and hidden (B, d).

        Verified tokens come with target features (aux_hidden (B, n, 3d), pairing token
        x_{i+1} with g_i); a speculative step passes the previous step's hidden (B, 1, d)
        with the token it proposed. Rows share one length (batch 1 in the engine). After
        a rejection, crop the cache back to the verified entries and step again with the
        target's features for the newly verified tokens.
        """
        B, n = input_ids.shape
        start = cache.get_seq_length()
        layer = self.layers[0]
        feature = self._feature(aux_hidden, prev_hidden)
        positions = (start + torch.arange(n, device=input_ids.device)).expand(B, n)
        q, k, v, residual = layer.qkv(
            self._embed(input_ids), feature, *self._rope(feature, positions)
        )
        keys, values = cache.update(k, v, 0)  # (B, Hkv, start + n, hd)
        mask = None
        if n > 1:
            s = torch.arange(start + n, device=input_ids.device)
            mask = s[None, :] <= (start + torch.arange(n, device=input_ids.device))[:, None]
        hidden = layer.attend_and_mlp(q, keys, values, mask, residual)[:, -1]  # (B, d)
        return self.lm_head(self.norm(hidden)), hidden
