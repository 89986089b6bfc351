"""The kinds registry and the draft.kind / draft.eagle3 config: one line per mistake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.config import config_from_dict
from draftsmith.errors import ConfigError
from draftsmith.kinds import KINDS, check_config, check_target, get_kind
from draftsmith.models import tiny_llama_config

REPO = Path(__file__).resolve().parents[1]


def cfg_with(**draft):
    cfg = config_from_dict({"draft": draft})
    check_config(cfg)  # the registry's part, which the CLI runs after loading
    return cfg


def test_kind_is_one_name_or_a_list_in_the_order_given():
    assert cfg_with().draft.kinds == ["independent"]
    assert cfg_with(kind="eagle3").draft.kinds == ["eagle3"]
    assert cfg_with(kind=["eagle3", "independent"]).draft.kinds == ["eagle3", "independent"]
    with pytest.raises(ConfigError) as e:
        cfg_with(kind=["eagle3", "eagle3"])
    assert str(e.value) == "draft.kind: ['eagle3', 'eagle3'] names a kind twice"
    with pytest.raises(ConfigError) as e:
        cfg_with(kind=[])
    assert (
        str(e.value)
        == "draft.kind: an empty list; name at least one registered kind (e.g. independent)"
    )
    with pytest.raises(
        ConfigError, match="^draft.kind: unknown kind 'medusa' \\(known: independent, eagle3\\)$"
    ):
        cfg_with(kind="medusa")


@pytest.mark.parametrize(
    "raw,message",
    [
        (
            {"draft": {"kind": "eagle3", "eagle3": {"aux_layer_ids": [1, 1, 2]}}},
            "draft.eagle3.aux_layer_ids: [1, 1, 2] must be 3 distinct layer ids >= 0 (or null)",
        ),
        (
            {"draft": {"kind": "eagle3", "eagle3": {"aux_layer_ids": [0, 2]}}},
            "draft.eagle3.aux_layer_ids: [0, 2] must be 3 distinct layer ids >= 0 (or null)",
        ),
        (
            {"draft": {"kind": "eagle3", "eagle3": {"draft_vocab_size": 0}}},
            "draft.eagle3.draft_vocab_size: must be >= 1, got 0",
        ),
        (
            {"draft": {"kind": "eagle3", "eagle3": {"ttt_steps": 0}}},
            "draft.eagle3.ttt_steps: must be >= 1, got 0",
        ),
        (
            {"draft": {"kind": "eagle3"}, "distill": {"on_policy_fraction": 0.5}},
            "distill.on_policy_fraction: the eagle3 kind trains on the target's own text (its "
            "training-time test drafts from its own states); set it to 0 or drop eagle3 from "
            "draft.kind",
        ),
        (
            {"draft": {"eagle3": {"ttt_step": 2}}},
            "draft.eagle3.ttt_step: unknown key (did you mean draft.eagle3.ttt_steps?)",
        ),
    ],
)
def test_eagle3_config_mistakes_are_one_line(raw, message):
    with pytest.raises(ConfigError) as e:
        check_config(config_from_dict(raw))
    assert str(e.value) == message


def test_an_independent_run_ignores_the_eagle3_section():
    cfg = config_from_dict({"draft": {"eagle3": {"aux_layer_ids": [1, 1, 2]}}})
    check_config(cfg)  # only the kinds draft.kind names check their keys
    assert cfg.draft.kinds == ["independent"]  # nothing to build from it
    with pytest.raises(ConfigError, match=r"^draft.eagle3.aux_layer_ids: \[1, 1, 2\] must be"):
        check_config(
            config_from_dict(
                {
                    "draft": {
                        "kind": ["independent", "eagle3"],
                        "eagle3": {"aux_layer_ids": [1, 1, 2]},
                    }
                }
            )
        )


def test_an_unknown_kind_fails_before_the_run_dir_is_made(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "distill", "configs/tiny.yaml"]
        + [f"run.output_dir={out}", "draft.kind=[independent,medusa]"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith("draft.kind: unknown kind 'medusa' (known: independent, eagle3)")
    assert not out.exists()


def _target_config(layers=8, model_type="llama", vocab=300):
    if model_type == "llama":
        return tiny_llama_config(vocab, num_hidden_layers=layers)
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab, n_layer=layers)


@pytest.mark.parametrize(
    "eagle3,target,message",
    [
        (
            {"aux_layer_ids": [1, 4, 8]},
            {},
            "draft.eagle3.aux_layer_ids: [1, 4, 8] must be 3 distinct layer ids in [0, 7] "
            "(the target has 8 layers)",
        ),
        (
            {},
            {"layers": 4},
            "draft.eagle3.aux_layer_ids: the default [2, 2, 1] does not fit a target with 4 "
            "layers (it needs at least 7); set 3 distinct ids in [0, 3]",
        ),
        (
            {"draft_vocab_size": 260},
            {},
            "draft.eagle3.draft_vocab_size: 260 is more than the target's 259 token ids; set at "
            "most 259",
        ),
        (
            {},
            {"model_type": "gpt2"},
            "draft.kind: eagle3 needs a Llama-family target (llama, mistral, qwen2, qwen3); "
            "this target is 'gpt2'",
        ),
    ],
)
def test_target_checks_name_the_key(eagle3, target, message, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # 259 token ids
    cfg = config_from_dict({"draft": {"kind": ["independent", "eagle3"], "eagle3": eagle3}})
    with pytest.raises(ConfigError) as e:
        check_target(cfg, _target_config(**target), tok)
    assert str(e.value) == message
    ok = config_from_dict({"draft": {"kind": "eagle3", "eagle3": {"draft_vocab_size": 259}}})
    check_target(ok, _target_config(), tok)  # the default ids (2, 4, 5) fit 8 layers


def test_run_refuses_a_bad_eagle3_target_before_generating(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "run", "configs/tiny.yaml"]
        + [f"run.output_dir={out}", "draft.kind=eagle3", "draft.eagle3.aux_layer_ids=null"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "draft.eagle3.aux_layer_ids: the default [2, 2, 1] does not fit a target with 4 layers "
            "(it needs at least 7); set 3 distinct ids in [0, 3]"
        )
    )
    assert not (out / "data").exists()  # failed before generate wrote anything


def test_registry_dirs_and_names(tmp_path):
    assert set(KINDS) == {"independent", "eagle3"}
    ind, e3 = get_kind("independent"), get_kind("eagle3")
    assert ind.checkpoints_dir(tmp_path) == tmp_path / "checkpoints"
    assert ind.ce_dir(tmp_path) == tmp_path / "ablations" / "ce"
    assert e3.checkpoints_dir(tmp_path) == tmp_path / "eagle3" / "checkpoints"
    assert e3.ce_dir(tmp_path) == tmp_path / "eagle3" / "ablations" / "ce"
    assert (ind.draft_name("checkpoint-6"), e3.draft_name("checkpoint-6")) == (
        "checkpoint-6",
        "eagle3-checkpoint-6",
    )


def test_list_drafts_carries_each_kind(tmp_path):
    from draftsmith.evaluate.prompts import list_drafts

    for sub in (
        "checkpoints/checkpoint-0",
        "checkpoints/checkpoint-4",
        "ablations/ce/checkpoint-4",
    ):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / "eagle3" / sub).mkdir(parents=True)
    drafts = list_drafts(tmp_path, ["independent", "eagle3"], [], ce_baseline=True)
    got = [(d.name, d.kind, d.role, d.trained_steps) for d in drafts]
    assert got == [
        ("checkpoint-0", "independent", "init", 0),
        ("checkpoint-4", "independent", "distilled", 4),
        ("ce-checkpoint-4", "independent", "ce_twin", 4),
        ("eagle3-checkpoint-0", "eagle3", "init", 0),
        ("eagle3-checkpoint-4", "eagle3", "distilled", 4),
        ("eagle3-ce-checkpoint-4", "eagle3", "ce_twin", 4),
    ]
    assert drafts[4].ref == str(tmp_path / "eagle3" / "checkpoints" / "checkpoint-4")


def test_comparisons_pair_drafts_within_their_kind():
    from draftsmith.evaluate.board import compare_drafts
    from draftsmith.evaluate.records import DraftEntry

    def res(acc):
        return [{"accepted": a, "proposed": 4} for a in acc]

    drafts = [
        DraftEntry(name=name, ref=name, role=role, kind=kind)
        for name, role, kind in (
            ("checkpoint-0", "init", "independent"),
            ("checkpoint-4", "distilled", "independent"),
            ("eagle3-checkpoint-0", "init", "eagle3"),
            ("eagle3-checkpoint-4", "distilled", "eagle3"),
        )
    ]
    per_prompt = {d.name: res([1, 2, 3]) for d in drafts}
    pairs = [(c["draft"], c["against"]) for c in compare_drafts(drafts, per_prompt, 0)]
    assert pairs == [
        ("checkpoint-4", "checkpoint-0"),
        ("eagle3-checkpoint-4", "eagle3-checkpoint-0"),
    ]


def test_a_kind_missing_part_of_the_interface_cannot_be_made():
    from draftsmith.kinds import DraftKind, IndependentKind

    class NoReplay(DraftKind):  # every method but replay
        name, root, own_tokenizer = "no-replay", "no-replay", False
        training = load = proposer = IndependentKind.training
        vllm_speculative_config = export = speculative_config = IndependentKind.export
        card_kind = card_training = card_usage = IndependentKind.card_kind

    with pytest.raises(TypeError, match="abstract method '?replay"):
        NoReplay()
    with pytest.raises(TypeError, match="draft kind Nameless does not set name, root"):

        class Nameless(DraftKind):
            own_tokenizer = False


def test_a_training_side_missing_part_of_the_interface_cannot_be_made():
    from draftsmith.kinds.base import KindTraining
    from draftsmith.kinds.independent.train import IndependentTraining

    assert all(isinstance(k.training(), KindTraining) for k in KINDS.values())
    methods = [m for m in dir(IndependentTraining) if not m.startswith("_") and m != "name"]
    body = {m: getattr(IndependentTraining, m) for m in methods if m != "loss_parts"}
    NoLoss = type("NoLoss", (KindTraining,), {"name": "no-loss", **body})
    with pytest.raises(TypeError, match="abstract method '?loss_parts"):
        NoLoss()
    type("Whole", (KindTraining,), {"name": "whole", **body, "loss_parts": None})()  # complete
    with pytest.raises(TypeError, match="kind training Nameless does not set name"):
        type("Nameless", (KindTraining,), body)


def test_checkpoint_kind_asks_each_kind_and_falls_back_to_independent(tmp_path):
    from draftsmith.kinds import checkpoint_kind

    for name, config in [
        ("eagle3", '{"speculators_model_type": "eagle3"}'),
        ("independent", '{"model_type": "llama"}'),
        ("independent", "[1, 2]"),  # not a mapping: the loader names the problem later
        ("independent", None),  # no config.json
    ]:
        folder = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        if config is not None:
            (folder / "config.json").write_text(config)
        assert checkpoint_kind(folder).name == name


def test_independent_records_an_allow_list_of_draft_keys():
    """The recorded settings are the independent kind's own keys: a new kind's section (or
    another key) added to draft changes nothing that its checkpoints were trained with."""
    import dataclasses

    from draftsmith.config import DraftConfig
    from draftsmith.kinds.independent.train import DRAFT_KEYS, IndependentTraining

    cfg = config_from_dict({"draft": {"init": "config", "num_hidden_layers": 3}})
    recorded = IndependentTraining().draft_settings(cfg)
    keys = {f.name for f in dataclasses.fields(DraftConfig) if f.init}
    # every draft key is the kind's or the kind switch; other kinds' settings are sections
    assert keys == set(DRAFT_KEYS) | {"kind"}
    assert set(cfg.draft.sections) == {n for n, k in KINDS.items() if k.config_section}
    assert recorded == {k: getattr(cfg.draft, k) for k in DRAFT_KEYS}
    assert recorded["num_hidden_layers"] == 3 and "eagle3" not in recorded

    cfg.draft.sections["medusa"] = {"heads": 4}  # a third kind's section beside eagle3's
    assert IndependentTraining().draft_settings(cfg) == recorded


def test_a_config_loaded_alone_knows_every_built_in_kinds_section():
    """A script that imports only draftsmith.config still reads draft.eagle3: the package
    registers the built-in kinds (and so their sections) before any config loads."""
    code = (
        "from draftsmith.config import load_config\n"
        "cfg = load_config('configs/tiny.yaml', ['draft.eagle3.ttt_steps=2'])\n"
        "print(cfg.draft.section('eagle3').ttt_steps)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
