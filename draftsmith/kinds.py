"""The kinds of draft, registered in one place: what each brings to the shared stages.

An independent draft (its own layers, embeddings and head: distill/init.py) and an eagle3
head (one layer on the target's own hidden states: draftsmith/eagle3.py) are two kinds of
the same thing, something that proposes k tokens for the target to verify. The config
section, the losses, the accelerate loop and its checkpoints, the engine's one
propose/verify/accept/crop loop, the metrics, the leaderboard and the export step are
shared; a kind brings only:

    where        its run-dir folder: independent `checkpoints/` (CE twin `ablations/ce/`),
                 eagle3 `eagle3/checkpoints/` (CE twin `eagle3/ablations/ce/`); same
                 atomic checkpoint-<step> layout, train state and draftsmith_checkpoint.json
    training     what the loop needs (`training()`: distill/independent_train.py IndependentTraining,
                 distill/eagle3_train.py Eagle3Training): how the draft is built or resumed,
                 the module accelerate prepares and its teacher, the loss parts and their
                 token counts, the checkpoint's model files, the checks against the target
    decoding     how the evaluate stage loads it, the engine's Proposer (evaluate/engine.py,
                 evaluate/eagle3_proposer.py), and its teacher-forced greedy replay giving
                 the engine's counts (evaluate/teacher_forced.py KindReplay)
    export       the files a serving stack loads (draftsmith/hf_export.py: vLLM
                 `draft_model`; draftsmith/eagle3_export.py: vLLM `eagle3`), its
                 speculative_config for vLLM and what the model card says about it

A new kind is one more DraftKind subclass here (an ABC: a kind missing one of the methods
cannot be instantiated) and its name in config.DraftKindName. This module
imports the kinds' code lazily (inside the methods) and none of that code imports this
module: the stages look a kind up here, the kinds' code never does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from draftsmith.config import Config
from draftsmith.errors import ConfigError


class DraftKind(ABC):
    """What a kind brings to the shared stages (the module docstring lists them)."""

    name: str
    root: str  # sub-folder of the run dir holding this kind's checkpoints ("" = the run dir)
    own_tokenizer: bool  # its checkpoints carry a tokenizer (checked against the target's)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        missing = [a for a in ("name", "root", "own_tokenizer") if not hasattr(cls, a)]
        if missing:
            raise TypeError(f"draft kind {cls.__name__} does not set {', '.join(missing)}")

    # -- training and decoding
    @abstractmethod
    def training(self):
        """The loop's side of the kind (distill/train.py): build, teacher, loss parts, files."""

    @abstractmethod
    def load(self, draft: dict, models):
        """The module the proposer and the replay run (models: the evaluate stage's loader)."""

    @abstractmethod
    def proposer(self, module):
        """The engine's Proposer (evaluate/engine.py) around `module`."""

    @abstractmethod
    def replay(self):
        """The teacher-forced greedy replay (evaluate/teacher_forced.py KindReplay)."""

    # -- serving and the model card
    @abstractmethod
    def vllm_speculative_config(self, cfg: Config, path: str, k: int) -> dict: ...

    @abstractmethod
    def export(self, cfg: Config, src: Path, k: int, tmp: Path, out: Path) -> None: ...

    @abstractmethod
    def speculative_config(self, out: Path, k: int) -> dict: ...

    @abstractmethod
    def card_kind(self, meta: dict | None) -> str: ...

    @abstractmethod
    def card_training(self, settings: dict) -> tuple[str, str]: ...

    @abstractmethod
    def card_usage(self, spec: str, target_path: str, out: Path, k: int) -> str: ...

    def claims(self, model_config: dict) -> bool:
        """Whether a checkpoint or export folder whose config.json reads `model_config` is
        this kind's (checkpoint_kind); the independent kind takes what no other claims."""
        return False

    def checkpoints_dir(self, output_dir: Path) -> Path:
        return Path(output_dir) / self.root / "checkpoints"

    def ce_dir(self, output_dir: Path) -> Path:
        """distill.ce_baseline: the plain cross-entropy twin (same data, steps and init)."""
        return Path(output_dir) / self.root / "ablations" / "ce"

    def draft_name(self, checkpoint: str) -> str:
        """The leaderboard name of one of this kind's checkpoints (unique across kinds)."""
        return checkpoint if not self.root else f"{self.root}-{checkpoint}"


# ----------------------------------------------------------------------------- independent


class IndependentKind(DraftKind):
    """A small causal LM of the target's tokenizer (distill/init.py)."""

    name, root, own_tokenizer = "independent", "", True

    def training(self):
        from draftsmith.distill.independent_train import IndependentTraining

        return IndependentTraining()

    def load(self, draft: dict, models):
        """The module the proposer and the replay run (models: the evaluate stage's loader)."""
        return models.draft(draft)

    def proposer(self, module):
        from draftsmith.evaluate.engine import IndependentProposer

        return IndependentProposer(module)

    def replay(self):
        from draftsmith.evaluate.teacher_forced import INDEPENDENT

        return INDEPENDENT

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
        from draftsmith.hf_export import export_independent

        export_independent(cfg, src, k, tmp, out)

    def speculative_config(self, out: Path, k: int) -> dict:
        from draftsmith.hf_export import speculative_config

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


# ----------------------------------------------------------------------------- eagle3


class Eagle3Kind(DraftKind):
    """An EAGLE-3 head on the target's hidden states, over a reduced draft vocabulary."""

    name, root, own_tokenizer = "eagle3", "eagle3", False

    def training(self):
        from draftsmith.distill.eagle3_train import Eagle3Training

        return Eagle3Training()

    def load(self, draft: dict, models):
        from draftsmith.eagle3_export import load_eagle3

        return load_eagle3(draft["ref"], models.target()).to(models.dtype).eval()

    def proposer(self, module):
        from draftsmith.evaluate.eagle3_proposer import Eagle3Proposer

        return Eagle3Proposer(module)

    def replay(self):
        from draftsmith.evaluate.eagle3_proposer import EAGLE3_REPLAY

        return EAGLE3_REPLAY

    def vllm_speculative_config(self, cfg: Config, path: str, k: int) -> dict:
        """evaluate.backend=vllm: the checkpoint (speculators layout) as vLLM's `eagle3`
        method; vLLM's default runner shares the target's embeddings with it (README)."""
        return {"method": "eagle3", "model": path, "num_speculative_tokens": k}

    def export(self, cfg: Config, src: Path, k: int, tmp: Path, out: Path) -> None:
        from draftsmith.eagle3_export import export_eagle3

        export_eagle3(cfg, src, k, tmp, out)

    def speculative_config(self, out: Path, k: int) -> dict:
        from draftsmith.eagle3_export import speculative_config

        return speculative_config(out, k)

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
from draftsmith.eagle3_export import load_eagle3
from draftsmith.evaluate.eagle3_proposer import Eagle3Proposer
from draftsmith.evaluate.engine import SpeculativeDecoder
head = load_eagle3("{out}", target)
out = SpeculativeDecoder(target, Eagle3Proposer(head), k={k}).generate(prompt_ids, 64).tokens
```"""


KINDS: dict[str, DraftKind] = {k.name: k for k in (IndependentKind(), Eagle3Kind())}
FALLBACK_KIND = "independent"  # a plain causal LM: a baseline, or a folder no kind claims


# ----------------------------------------------------------------------------- lookups


def get_kind(name: str) -> DraftKind:
    try:
        return KINDS[name]
    except KeyError:
        known = ", ".join(KINDS)
        raise ConfigError(f"draft.kind: unknown kind {name!r} (known: {known})") from None


def kind_of(draft: dict) -> DraftKind:
    """The kind of a draft dict (evaluate.prompts.list_drafts; baselines are independent)."""
    return get_kind(draft.get("kind") or FALLBACK_KIND)


def checkpoint_kind(path: Path) -> DraftKind:
    """The kind of a checkpoint or export folder on disk, from its config.json: the kind that
    claims it (DraftKind.claims), else an independent causal LM."""
    import json

    try:
        model_config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        model_config = None  # unreadable here: the loader names the problem
    if isinstance(model_config, dict):
        for kind in KINDS.values():
            if kind.claims(model_config):
                return kind
    return get_kind(FALLBACK_KIND)


def check_target(cfg: Config, target_config, num_ids: int) -> None:
    """Every configured kind's checks against the target (its config and token count only)."""
    for name in cfg.draft.kinds:
        get_kind(name).training().check_target(cfg, target_config, num_ids)


def teacher_forced_results(
    draft: dict, models, refs: list[dict], k: int, max_new_tokens: int, vocab: int | None
) -> list[dict]:
    """The engine's greedy counts for `draft` (no timings) on refs, by its kind's replay: per
    prompt {"id", "category", "prompt_ids", "tokens": the target's greedy output}."""
    from draftsmith.evaluate.teacher_forced import teacher_forced_results as replay

    kind = kind_of(draft)
    module = kind.load(draft, models)
    return replay(module, refs, k, max_new_tokens, vocab, kind.replay(), models.target)
