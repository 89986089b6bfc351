"""A third kind of draft, defined here and nowhere in the package, runs the whole pipeline.

The kind is a truncated copy of the target: one decoder layer, chosen by its own config
section `draft.one-layer.layer`, with the target's embeddings, norm and head (draftsmith's
own `from_target` init keeps the first layers by default). It brings only what a kind must
(draftsmith/kinds/base.py DraftKind): a name, a run-dir folder, its config section and its
training side's build step; everything else comes from the registry's interface. If a
stage, the config or export named the kinds it knows, this run would fail.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from draftsmith import config, kinds
from draftsmith.cli import main
from draftsmith.config import load_config
from draftsmith.errors import ConfigError
from draftsmith.kinds.independent.init import draft_from_target
from draftsmith.kinds.independent.train import IndependentTraining

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class OneLayerConfig:
    """draft.one-layer: which target layer the draft copies (Python's indexing: -1 the last)."""

    layer: int = -1


def one_layer_settings(cfg) -> OneLayerConfig:
    return cfg.draft.section("one-layer")


class OneLayerTraining(IndependentTraining):
    """Trains like an independent draft; built from one of the target's layers."""

    name = "one-layer"

    def draft_settings(self, cfg):  # its own section is part of what it trains
        return {
            **super().draft_settings(cfg),
            "one-layer": dataclasses.asdict(one_layer_settings(cfg)),
        }

    def load_draft(self, cfg, resume, target, target_tok, target_config, data, device):
        if resume is not None:  # a checkpoint of this kind is a plain HF model dir
            return super().load_draft(cfg, resume, target, target_tok, target_config, data, device)
        layer = range(target.config.num_hidden_layers)[one_layer_settings(cfg).layer]
        draft = draft_from_target(target, [layer]).to(device).train()
        return draft, target_tok, f"the target's layer {layer} (one-layer kind)", {}


class OneLayerKind(kinds.IndependentKind):
    name, root, own_tokenizer = "one-layer", "one-layer", True
    config_section = OneLayerConfig

    def training(self):
        return OneLayerTraining()

    def card_kind(self, meta):
        return "one-layer (a copy of one of the target's decoder layers, its embeddings and head)"


@pytest.fixture(scope="module")
def third_kind_run(tmp_path_factory):
    kinds.register_kind(OneLayerKind())
    try:
        out = tmp_path_factory.mktemp("third") / "run"
        rc = main(["run", str(REPO / "configs/tiny.yaml"), f"run.output_dir={out}",
                   "draft.kind=[independent,one-layer]", "draft.one-layer.layer=-2"])  # fmt: skip
        yield out, rc
    finally:
        kinds.KINDS.pop("one-layer")
        config.KIND_SECTIONS.pop("one-layer")


def test_a_kind_from_outside_the_package_trains_ranks_and_exports(third_kind_run):
    out, rc = third_kind_run
    assert rc == 0
    saved = load_config(out / "config.yaml")  # its section written back under its name
    assert saved.draft.kinds == ["independent", "one-layer"]
    assert one_layer_settings(saved) == OneLayerConfig(layer=-2)

    # distill: its own folder, its own init (the target's last layer), its name recorded
    ckpts = out / "one-layer" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("checkpoint-*")) == [
        "checkpoint-0",
        "checkpoint-3",
        "checkpoint-6",
    ]
    meta = json.loads((ckpts / "checkpoint-6" / "draftsmith_checkpoint.json").read_text())
    assert meta["kind"] == "one-layer" and meta["step"] == 6
    assert meta["settings"]["draft"]["one-layer"] == {"layer": -2}
    from transformers import AutoModelForCausalLM

    from draftsmith.models import load_target

    target = load_target(load_config(out / "config.yaml").target, torch.device("cpu"))
    init = AutoModelForCausalLM.from_pretrained(ckpts / "checkpoint-0")
    assert init.config.num_hidden_layers == 1
    assert torch.equal(  # draft.one-layer.layer=-2: the section reached the kind's build
        init.model.layers[0].mlp.down_proj.weight, target.model.layers[-2].mlp.down_proj.weight
    )
    first = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "checkpoint-0")
    assert not torch.equal(  # the independent kind's from_target init is another layer
        first.model.layers[0].mlp.down_proj.weight, init.model.layers[0].mlp.down_proj.weight
    )

    # evaluate: ranked beside the independent kind by its replay, decoded by the engine
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    mine = [r for r in board["rows"] if r["kind"] == "one-layer"]
    tf = {r["checkpoint"] for r in mine if r["measured_by"] == "teacher_forced"}
    assert tf == {f"one-layer-checkpoint-{s}" for s in (0, 3, 6)}
    engine = [r for r in mine if r["measured_by"] == "engine"]
    assert engine and all(r["lossless_match_rate"] == 1.0 for r in engine)
    assert all(r["replay_match_rate"] == 1.0 for r in engine)
    pairs = {(c["draft"], c["against"]) for c in board["comparisons"] if c["role"] != "other_kind"}
    assert ("one-layer-checkpoint-6", "one-layer-checkpoint-0") in pairs

    # export: whichever kind won, the other is exportable by name through its kind
    assert rc == 0 and (out / "export" / "draftsmith_export.json").is_file()
    assert main(["export", str(out / "config.yaml"), "export.checkpoint=one-layer-checkpoint-6",
                 f"export.output_dir={out / 'export-last'}"]) == 0  # fmt: skip
    card = (out / "export-last" / "README.md").read_text()
    assert "one-layer (a copy of one of the target's decoder layers" in card
    exported = AutoModelForCausalLM.from_pretrained(out / "export-last")
    assert exported.config.num_hidden_layers == 1


def test_a_kind_cannot_take_a_name_or_folder_already_registered():
    with pytest.raises(ValueError, match="'independent' is registered already"):
        kinds.register_kind(kinds.IndependentKind())

    class SameFolder(OneLayerKind):
        name, root = "same-folder", "eagle3"

    with pytest.raises(ValueError, match="folder 'eagle3' is eagle3's"):
        kinds.register_kind(SameFolder())
    assert "same-folder" not in kinds.KINDS


def test_a_kind_section_is_a_config_key_only_while_its_kind_is_registered():
    class Sectioned(OneLayerKind):  # not the module fixture's kind, which may be registered
        name, root = "sectioned", "sectioned"

    raw = {"draft": {"sectioned": {"layer": -2}}}
    with pytest.raises(ConfigError, match=r"^draft.sectioned: unknown key"):
        config.config_from_dict(raw)
    kinds.register_kind(Sectioned())
    try:
        assert config.config_from_dict({}).draft.section("sectioned") == OneLayerConfig()
        assert config.config_from_dict(raw).draft.section("sectioned").layer == -2
        with pytest.raises(ConfigError, match=r"^draft.sectioned.layers: unknown key \(did you"):
            config.config_from_dict({"draft": {"sectioned": {"layers": 1}}})
    finally:
        kinds.KINDS.pop("sectioned")
        config.KIND_SECTIONS.pop("sectioned")


def test_a_kind_section_cannot_shadow_a_draft_key():
    class Shadow(OneLayerKind):
        name, root = "model", "shadow"

    with pytest.raises(ValueError, match="draft.model is a key of every kind"):
        kinds.register_kind(Shadow())
    assert "model" not in kinds.KINDS and "model" not in config.KIND_SECTIONS
