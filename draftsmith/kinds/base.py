"""What a kind of draft brings to the shared stages: the interface (draftsmith/kinds/)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type hints only: the interface needs no config at runtime
    from draftsmith.config import Config
    from draftsmith.evaluate.records import DraftEntry


class DraftKind(ABC):
    """What a kind brings to the shared stages (the module docstring lists them)."""

    name: str
    root: str  # sub-folder of the run dir holding this kind's checkpoints ("" = the run dir)
    own_tokenizer: bool  # its checkpoints carry a tokenizer (checked against the target's)
    # The dataclass of the settings only this kind has, read from draft.<name> (defaults
    # where the YAML leaves it out); None: it has none.
    config_section: type | None = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        missing = [a for a in ("name", "root", "own_tokenizer") if not hasattr(cls, a)]
        if missing:
            raise TypeError(f"draft kind {cls.__name__} does not set {', '.join(missing)}")

    # -- training and decoding
    @abstractmethod
    def training(self) -> KindTraining:
        """The loop's side of the kind (distill/train.py): build, teacher, loss parts, files."""

    @abstractmethod
    def load(self, draft: DraftEntry, models):
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

    def check_config(self, cfg: Config) -> None:
        """Raise ConfigError, naming the key, for settings this kind cannot run with
        (kinds.check_config calls it for every kind draft.kind names)."""
        return None

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


class KindTraining(ABC):
    """What distill/train.py's loop asks of a kind while it trains one (DraftKind.training()).

    `tr` below is the loop's state (distill/train.py Trainer: cfg, draft, target, teacher,
    tokenizer); `batch` a distill/batching.py Batch. A kind's loss is a list of parts, each a
    TokenSum over its own tokens (an eagle3 head: one per training-time-test step), weighted
    by loss_weights and summed exactly across gradient accumulation.
    """

    name: str  # recorded in each checkpoint; a resume refuses another kind's checkpoints

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if not hasattr(cls, "name"):
            raise TypeError(f"kind training {cls.__name__} does not set name")

    # -- what a checkpoint records, and what the target must be
    @abstractmethod
    def draft_settings(self, cfg: Config) -> dict:
        """The draft keys that change what this kind trains (an allow-list: resume checks them)."""

    @abstractmethod
    def check_target(self, cfg: Config, target_config, target_tok) -> None:
        """One line naming the key when this kind cannot be built on the target, from its
        config and tokenizer only (no weights): `draftsmith run` calls it before generate."""

    # -- the teacher
    @abstractmethod
    def reads_topk(self, cfg: Config, loss_name: str) -> bool:
        """Whether training reads the stored top-k log-probs (an offline teacher)."""

    @abstractmethod
    def teacher_name(self, cfg: Config, loss_name: str) -> str:
        """The teacher recorded for the run (online, offline, ...)."""

    @abstractmethod
    def needs_target_weights(self, cfg: Config, loss_name: str, resume) -> bool:
        """Whether the target's weights must be loaded (not only its config)."""

    @abstractmethod
    def target_dtype(self, cfg: Config, device):
        """The dtype the target is loaded in for training (None: target.dtype)."""

    # -- building the draft and what accelerate prepares
    @abstractmethod
    def load_draft(self, cfg: Config, resume, target, target_tok, target_config, data, device):
        """(draft, tokenizer, init description, extra meta): built fresh or resumed."""

    @abstractmethod
    def describe(self, draft, target_config, say) -> dict:
        """Its size and cost beside the target's, said once and recorded."""

    @abstractmethod
    def training_modules(self, cfg: Config, loss_name: str, draft, target, num_ids: int, device):
        """(teacher module or None, the module accelerate prepares)."""

    @abstractmethod
    def learning_rate(self, cfg: Config) -> float: ...

    @abstractmethod
    def trainable_parameters(self, cfg: Config, draft) -> list:
        """The parameters the optimizer updates."""

    # -- the loss
    @abstractmethod
    def loss_weights(self, cfg: Config) -> list[float]:
        """One weight per loss part."""

    @abstractmethod
    def token_counts(self, tr, batch) -> list[float]:
        """Each loss part's token count in `batch` (the exact mean's denominators)."""

    @abstractmethod
    def loss_parts(self, tr, batch, on_policy: bool) -> list:
        """Each loss part's TokenSum on `batch` (distill/losses.py)."""

    # -- the checkpoint
    @abstractmethod
    def model_writer(self, tr):
        """A function writing the checkpoint's model files into a directory."""
