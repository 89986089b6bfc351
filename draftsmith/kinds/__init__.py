"""The kinds of draft, registered in one place: each kind's home is a package here.

    base.py        DraftKind, the interface every kind implements, and KindTraining, what
                   distill's loop asks of one (both ABCs: a missing method fails at once)
    independent/   a small causal LM of the target's tokenizer: __init__ (IndependentKind),
                   init.py (draft.init: from_target, pretrained or config), train.py (its
                   training side), export.py (a plain HF model dir); its proposer and
                   replay are the engine's defaults (evaluate/engine.py, teacher_forced.py)
    eagle3/        an EAGLE-3 head on the target's hidden states: __init__ (Eagle3Kind),
                   head.py, vocab.py (its reduced draft vocabulary), train.py,
                   proposer.py (Proposer and replay), export.py, config.py (its section
                   draft.eagle3, a DraftKind.config_section)

Both are two kinds of one thing, something that proposes k tokens for the target to verify.
The config section, the losses, the accelerate loop and its checkpoints, the engine's one
propose/verify/accept/crop loop, the metrics, the leaderboard and the export step are
shared; a kind brings its run-dir folder (independent `checkpoints/`, eagle3
`eagle3/checkpoints/`, each with its CE twin under `ablations/ce/`), its training side, how
the evaluate stage loads, proposes and replays it, and what export writes and the model
card says (DraftKind lists them).

A new kind is one DraftKind subclass handed to `register_kind`, from inside the package or
outside it: `draft.kind` is checked against the registry and each kind checks its own
config keys (check_config, run by the CLI before a stage writes);
tests/test_third_kind.py runs a kind defined in the test file through distill, evaluate
and export. The stages look a kind up here; the kinds' own code is imported lazily
(inside their methods) and never imports this registry.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith import config
from draftsmith.errors import ConfigError
from draftsmith.kinds.base import DraftKind
from draftsmith.kinds.eagle3 import Eagle3Kind
from draftsmith.kinds.independent import IndependentKind

if TYPE_CHECKING:
    from draftsmith.config import Config
    from draftsmith.evaluate.records import DraftEntry, LeaderboardRow

KINDS: dict[str, DraftKind] = {}
FALLBACK_KIND = "independent"  # a plain causal LM: a baseline, or a folder no kind claims


# ----------------------------------------------------------------------------- lookups


def register_kind(kind: DraftKind) -> DraftKind:
    """Make `kind` a value of draft.kind, and its config_section the key draft.<name>. Its
    name and its run-dir folder must be new: two kinds writing one checkpoints/ folder would
    resume each other's checkpoints."""
    if kind.name in KINDS:
        raise ValueError(f"draft kind {kind.name!r} is registered already")
    if kind.config_section and kind.name in {f.name for f in fields(config.DraftConfig)}:
        raise ValueError(f"draft kind {kind.name!r}: draft.{kind.name} is a key of every kind")
    taken = {k.root: k.name for k in KINDS.values()}
    if kind.root in taken:
        raise ValueError(f"draft kind {kind.name!r}: folder {kind.root!r} is {taken[kind.root]}'s")
    KINDS[kind.name] = kind
    if kind.config_section:
        config.KIND_SECTIONS[kind.name] = kind.config_section
    return kind


register_kind(IndependentKind())
register_kind(Eagle3Kind())


def check_config(cfg: Config) -> None:
    """draft.kind names registered kinds, and each checks the keys it reads: one line naming
    the key. The CLI runs it on every loaded config before a stage writes anything."""
    for name in cfg.draft.kinds:
        get_kind(name).check_config(cfg)


def get_kind(name: str) -> DraftKind:
    try:
        return KINDS[name]
    except KeyError:
        known = ", ".join(KINDS)
        raise ConfigError(f"draft.kind: unknown kind {name!r} (known: {known})") from None


def kind_of(record: DraftEntry | LeaderboardRow) -> DraftKind:
    """The kind of a draft or of a leaderboard row (evaluate/records.py: every one names its
    kind; list_drafts gives baselines FALLBACK_KIND)."""
    return get_kind(record.kind)


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


def check_target(cfg: Config, target_config, target_tok) -> None:
    """Every configured kind's checks against the target (its config and tokenizer only)."""
    for name in cfg.draft.kinds:
        get_kind(name).training().check_target(cfg, target_config, target_tok)


def teacher_forced_results(
    draft: DraftEntry,
    models,
    refs: list[dict],
    k: int,
    max_new_tokens: int,
    vocab: int | None,
    prepare=None,
) -> list[dict]:
    """The engine's greedy counts for `draft` (no timings) on refs, by its kind's replay: per
    prompt {"id", "category", "prompt_ids", "tokens": the target's greedy output}.
    `prepare(module)`, if given, changes the loaded draft in place first (rounded weights)."""
    from draftsmith.evaluate.teacher_forced import teacher_forced_results as replay

    kind = kind_of(draft)
    module = kind.load(draft, models)
    if prepare is not None:
        prepare(module)
    return replay(module, refs, k, max_new_tokens, vocab, kind.replay(), models.target)
