"""What a kind of draft brings to the shared stages: the interface (draftsmith/kinds/)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the config module looks kinds up here (lazily): no import back at runtime
    from draftsmith.config import Config


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
