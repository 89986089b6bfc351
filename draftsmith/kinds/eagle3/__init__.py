"""The eagle3 kind: an EAGLE-3 head on the target's hidden states, over a reduced draft
vocabulary. Its home: head.py (the module), vocab.py (the reduced draft vocabulary),
train.py (its training side, with the training-time test), proposer.py (the engine's
Proposer and the teacher-forced replay), export.py (the speculators layout vLLM's `eagle3`
method loads), config.py (its section, draft.eagle3)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import ConfigError
from draftsmith.kinds.base import DraftKind
from draftsmith.kinds.eagle3.config import Eagle3Config, eagle3_settings

if TYPE_CHECKING:
    from draftsmith.config import Config
    from draftsmith.evaluate.records import DraftEntry


class Eagle3Kind(DraftKind):
    """An EAGLE-3 head on the target's hidden states, over a reduced draft vocabulary."""

    name, root, own_tokenizer = "eagle3", "eagle3", False
    config_section = Eagle3Config

    def training(self):
        from draftsmith.kinds.eagle3.train import Eagle3Training

        return Eagle3Training()

    def load(self, draft: DraftEntry, models):
        from draftsmith.kinds.eagle3.export import load_eagle3

        return load_eagle3(draft.ref, models.target()).to(models.dtype).eval()

    def proposer(self, module):
        from draftsmith.kinds.eagle3.proposer import Eagle3Proposer

        return Eagle3Proposer(module)

    def replay(self):
        from draftsmith.kinds.eagle3.proposer import EAGLE3_REPLAY

        return EAGLE3_REPLAY

    def vllm_speculative_config(self, cfg: Config, path: str, k: int) -> dict:
        """evaluate.backend=vllm: the checkpoint (speculators layout) as vLLM's `eagle3`
        method; vLLM's default runner shares the target's embeddings with it (README)."""
        return {"method": "eagle3", "model": path, "num_speculative_tokens": k}

    def export(self, cfg: Config, src: Path, k: int, tmp: Path, out: Path) -> None:
        from draftsmith.kinds.eagle3.export import export_eagle3

        export_eagle3(cfg, src, k, tmp, out)

    def speculative_config(self, out: Path, k: int) -> dict:
        from draftsmith.kinds.eagle3.export import speculative_config

        return speculative_config(out, k)

    def check_config(self, cfg: Config) -> None:
        ids = eagle3_settings(cfg).aux_layer_ids
        if ids is not None and (len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0):
            raise ConfigError(
                f"draft.eagle3.aux_layer_ids: {ids} must be 3 distinct layer ids >= 0 (or null)"
            )
        if cfg.distill.on_policy_fraction > 0:
            raise ConfigError(
                "distill.on_policy_fraction: the eagle3 kind trains on the target's own text "
                "(its training-time test drafts from its own states); set it to 0 or drop "
                "eagle3 from draft.kind"
            )

    def claims(self, model_config: dict) -> bool:
        # the speculators layout, which eagle3 checkpoints and exports alike are written in
        return model_config.get("speculators_model_type") == "eagle3"

    def card_kind(self, meta: dict | None) -> str:
        m = meta or {}
        e = m.get("settings", {}).get("draft", {}).get("eagle3", {})
        return (
            f"eagle3 head (one decoder layer on the target's hidden states of layers "
            f"{m.get('aux_layer_ids')}, draft vocabulary of {m.get('draft_vocab_size')} tokens "
            f"covering {m.get('draft_vocab_coverage', 0):.1%} of the training completion tokens, "
            f"norm_before_residual {str(e.get('norm_before_residual')).lower()})"
        )

    def card_training(self, settings: dict) -> tuple[str, str]:
        e = settings["draft"]["eagle3"]  # a head learns from the target forward it reads: online
        return (
            "online",
            f", training-time test {e['ttt_steps']} steps (step weights {e['ttt_loss_decay']}^j)",
        )

    def card_usage(self, spec: str, target_path: str, out: Path, k: int) -> str:
        return f"""vLLM:
```
vllm serve {target_path} --speculative-config '{spec}'
```
(vLLM's default model runner keeps this head's reduced lm_head; draftsmith's README, section
vLLM, says why not VLLM_USE_V2_MODEL_RUNNER=1 on 0.15.0.)
draftsmith's own engine (`target`: the verifier, loaded with transformers):
```python
from draftsmith.kinds.eagle3.export import load_eagle3
from draftsmith.kinds.eagle3.proposer import Eagle3Proposer
from draftsmith.evaluate.engine import SpeculativeDecoder
head = load_eagle3("{out}", target)
out = SpeculativeDecoder(target, Eagle3Proposer(head), k={k}).generate(prompt_ids, 64).tokens
```"""
