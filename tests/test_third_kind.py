"""A third kind of draft, defined here and nowhere in the package, runs the whole pipeline.

The kind is a truncated copy of the target: its last decoder layer with the target's
embeddings, norm and head (draftsmith's own `from_target` init keeps the first layers by
default). It brings only what a kind must (draftsmith/kinds/base.py DraftKind): a name, a run-dir
folder and its training side's build step; everything else comes from the registry's
interface. If a stage, the config or export named the kinds it knows, this run would fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith import kinds
from draftsmith.cli import main
from draftsmith.config import load_config
from draftsmith.distill.init import draft_from_target
from draftsmith.kinds.independent.train import IndependentTraining

REPO = Path(__file__).resolve().parents[1]


class LastLayerTraining(IndependentTraining):
    """Trains like an independent draft; built from the target's last layer."""

    name = "last-layer"

    def load_draft(self, cfg, resume, target, target_tok, target_config, data, device):
        if resume is not None:  # a checkpoint of this kind is a plain HF model dir
            return super().load_draft(cfg, resume, target, target_tok, target_config, data, device)
        last = target.config.num_hidden_layers - 1
        draft = draft_from_target(target, [last]).to(device).train()
        return draft, target_tok, f"the target's layer {last} (last-layer kind)", {}


class LastLayerKind(kinds.IndependentKind):
    name, root, own_tokenizer = "last-layer", "last-layer", True

    def training(self):
        return LastLayerTraining()

    def card_kind(self, meta):
        return "last-layer (a copy of the target's last decoder layer, embeddings and head)"


@pytest.fixture(scope="module")
def third_kind_run(tmp_path_factory):
    kinds.register_kind(LastLayerKind())
    try:
        out = tmp_path_factory.mktemp("third") / "run"
        rc = main(["run", str(REPO / "configs/tiny.yaml"), f"run.output_dir={out}",
                   "draft.kind=[independent,last-layer]"])  # fmt: skip
        yield out, rc
    finally:
        kinds.KINDS.pop("last-layer")


def test_a_kind_from_outside_the_package_trains_ranks_and_exports(third_kind_run):
    out, rc = third_kind_run
    assert rc == 0
    assert load_config(out / "config.yaml").draft.kinds == ["independent", "last-layer"]

    # distill: its own folder, its own init (the target's last layer), its name recorded
    ckpts = out / "last-layer" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("checkpoint-*")) == [
        "checkpoint-0",
        "checkpoint-3",
        "checkpoint-6",
    ]
    meta = json.loads((ckpts / "checkpoint-6" / "draftsmith_checkpoint.json").read_text())
    assert meta["kind"] == "last-layer" and meta["step"] == 6
    from transformers import AutoModelForCausalLM

    from draftsmith.models import load_target

    target = load_target(load_config(out / "config.yaml").target, torch.device("cpu"))
    init = AutoModelForCausalLM.from_pretrained(ckpts / "checkpoint-0")
    assert init.config.num_hidden_layers == 1
    last = target.config.num_hidden_layers - 1
    assert torch.equal(
        init.model.layers[0].mlp.down_proj.weight, target.model.layers[last].mlp.down_proj.weight
    )
    first = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "checkpoint-0")
    assert not torch.equal(  # the independent kind's from_target init is another layer
        first.model.layers[0].mlp.down_proj.weight, init.model.layers[0].mlp.down_proj.weight
    )

    # evaluate: ranked beside the independent kind by its replay, decoded by the engine
    board = json.loads((out / "eval" / "leaderboard.json").read_text())
    mine = [r for r in board["rows"] if r["kind"] == "last-layer"]
    tf = {r["checkpoint"] for r in mine if r["measured_by"] == "teacher_forced"}
    assert tf == {f"last-layer-checkpoint-{s}" for s in (0, 3, 6)}
    engine = [r for r in mine if r["measured_by"] == "engine"]
    assert engine and all(r["lossless_match_rate"] == 1.0 for r in engine)
    assert all(r["replay_match_rate"] == 1.0 for r in engine)
    pairs = {(c["draft"], c["against"]) for c in board["comparisons"] if c["role"] != "other_kind"}
    assert ("last-layer-checkpoint-6", "last-layer-checkpoint-0") in pairs

    # export: whichever kind won, the other is exportable by name through its kind
    assert rc == 0 and (out / "export" / "draftsmith_export.json").is_file()
    assert main(["export", str(out / "config.yaml"), "export.checkpoint=last-layer-checkpoint-6",
                 f"export.output_dir={out / 'export-last'}"]) == 0  # fmt: skip
    card = (out / "export-last" / "README.md").read_text()
    assert "last-layer (a copy of the target's last decoder layer" in card
    exported = AutoModelForCausalLM.from_pretrained(out / "export-last")
    assert exported.config.num_hidden_layers == 1


def test_a_kind_cannot_take_a_name_or_folder_already_registered():
    with pytest.raises(ValueError, match="'independent' is registered already"):
        kinds.register_kind(kinds.IndependentKind())

    class SameFolder(LastLayerKind):
        name, root = "same-folder", "eagle3"

    with pytest.raises(ValueError, match="folder 'eagle3' is eagle3's"):
        kinds.register_kind(SameFolder())
    assert "same-folder" not in kinds.KINDS
