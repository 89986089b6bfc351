"""The independent kind: a small causal LM of the target's tokenizer (its own layers,
embeddings and head), built by init.py, trained by train.py here, decoded by the
engine's CausalLMProposer and replayed by evaluate/teacher_forced.py's CAUSAL_LM_REPLAY,
exported as a plain HF model dir (export.py here: vLLM `draft_model`, transformers'
`assistant_model=`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.kinds.base import DraftKind

if TYPE_CHECKING:
    from draftsmith.config import Config
    from draftsmith.evaluate.records import DraftEntry


class IndependentKind(DraftKind):
    """A small causal LM of the target's tokenizer (init.py)."""

    name, root, own_tokenizer = "independent", "", True

    def training(self):
        from draftsmith.kinds.independent.train import IndependentTraining

        return IndependentTraining()

    def load(self, draft: DraftEntry, models):
        """The module the proposer and the replay run (models: the evaluate stage's loader)."""
        return models.draft(draft)

    def proposer(self, module):
        from draftsmith.evaluate.engine import CausalLMProposer

        return CausalLMProposer(module)

    def replay(self):
        from draftsmith.evaluate.teacher_forced import CAUSAL_LM_REPLAY

        return CAUSAL_LM_REPLAY

    def vllm_speculative_config(self, cfg: Config, path: str, k: int) -> dict:
        """evaluate.backend=vllm: the draft as vLLM's `draft_model` method."""
        # vLLM (0.15) runs an independent draft only at the target's tensor-parallel size
        return {
            "method": "draft_model",
            "model": path,
            "num_speculative_tokens": k,
            "draft_tensor_parallel_size": cfg.evaluate.vllm.tensor_parallel_size,
        }

    def export(self, cfg: Config, src: Path, k: int, tmp: Path, out: Path) -> None:
        """Write the checkpoint `src`'s export files and speculative_config.json into tmp,
        checked; `out`: where tmp will be renamed to."""
        from draftsmith.kinds.independent.export import export_independent

        export_independent(cfg, src, k, tmp, out)

    def speculative_config(self, out: Path, k: int) -> dict:
        from draftsmith.kinds.independent.export import speculative_config

        return speculative_config(out, k)

    def card_kind(self, meta: dict | None) -> str:
        """The model card's kind line, from the checkpoint's record (None for a baseline)."""
        return "independent (its own layers, embeddings and head)"

    def card_training(self, settings: dict) -> tuple[str, str]:
        """(teacher, what else the card's training line says), from the recorded settings."""
        return settings["distill"]["teacher"], ""

    def card_usage(self, spec: str, target_path: str, out: Path, k: int) -> str:
        return f"""vLLM:
```
vllm serve {target_path} --speculative-config '{spec}'
```
transformers:
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
target = AutoModelForCausalLM.from_pretrained("{target_path}")
draft = AutoModelForCausalLM.from_pretrained("{out}")
tok = AutoTokenizer.from_pretrained("{out}")
inputs = tok("Hello", return_tensors="pt")
out = target.generate(**inputs, assistant_model=draft, do_sample=False)  # k={k}: generation_config.json
```"""
