"""Every stage loads the target through draftsmith.models.load_target*: each from_pretrained
call on the target gets the config's revision and trust_remote_code."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import transformers

from draftsmith.config import load_config

REPO = Path(__file__).resolve().parents[1]
LOADERS = ("AutoModelForCausalLM", "AutoTokenizer", "AutoConfig", "GenerationConfig")


@pytest.fixture
def target_calls(monkeypatch, tiny_model_dir):
    """[(stage, loader, kwargs)] of every from_pretrained call draftsmith makes on the
    target's directory (the calls transformers makes inside one are its own business)."""
    calls, stage, depth = [], {"name": None}, [0]
    target = str(Path(tiny_model_dir).resolve())
    for name in LOADERS:
        cls = getattr(transformers, name)
        real = cls.from_pretrained.__func__

        def record(klass, path, *args, _real=real, _name=name, **kw):
            if depth[0] == 0 and str(Path(str(path)).resolve()) == target:
                calls.append((stage["name"], _name, kw))
            depth[0] += 1
            try:
                return _real(klass, path, *args, **kw)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(cls, "from_pretrained", classmethod(record))
    return calls, stage


def _cfg(tmp_path, tiny_model_dir, *extra):
    return load_config(
        REPO / "configs" / "tiny.yaml",
        [
            f"run.output_dir={tmp_path / 'run'}",
            f"target.model={tiny_model_dir}",
            "target.revision=v1",
            "target.trust_remote_code=true",
            "data.max_train_prompts=8",
            "data.max_new_tokens=6",
            "distill.max_steps=1",
            "distill.batch_size=2",
            "evaluate.max_prompts=2",
            "evaluate.max_new_tokens=4",
            "evaluate.k_sweep=[1]",
            "tracking.wandb.mode=disabled",
            *extra,
        ],
    )


def test_every_stage_passes_revision_and_trust_remote_code(tmp_path, tiny_model_dir, target_calls):
    from draftsmith.data.generate import run_generate
    from draftsmith.distill.stage import run_distill
    from draftsmith.evaluate.stage import run_evaluate

    calls, stage = target_calls
    cfg = _cfg(tmp_path, tiny_model_dir)
    for name, fn in (("generate", run_generate), ("distill", run_distill)):
        stage["name"] = name
        fn(cfg)
    stage["name"] = "evaluate"
    run_evaluate(cfg)

    loaded = {(s, loader) for s, loader, _ in calls}
    assert {
        ("generate", "AutoConfig"),
        ("generate", "AutoTokenizer"),
        ("generate", "AutoModelForCausalLM"),
        ("distill", "AutoTokenizer"),
        ("distill", "AutoModelForCausalLM"),
        ("evaluate", "AutoTokenizer"),
        ("evaluate", "AutoModelForCausalLM"),
    } <= loaded
    wrong = [(s, loader, kw) for s, loader, kw in calls if kw.get("revision") != "v1"]
    wrong += [(s, loader, kw) for s, loader, kw in calls if kw.get("trust_remote_code") is not True]
    assert wrong == []


def test_vllm_generate_passes_them_to_the_generation_config_and_the_engine(
    tmp_path, tiny_model_dir, target_calls, monkeypatch
):
    from draftsmith.data.generate import make_backend
    from draftsmith.models import load_target_tokenizer

    engines = []
    vllm = ModuleType("vllm")
    vllm.__version__ = "0.15.0"
    vllm.LLM = lambda **kw: engines.append(kw)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    calls, stage = target_calls
    cfg = _cfg(tmp_path, tiny_model_dir, "data.backend=vllm")
    stage["name"] = "generate"
    backend = make_backend(cfg, load_target_tokenizer(cfg.target), str(tiny_model_dir))
    assert [loader for _, loader, _ in calls] == ["AutoTokenizer", "GenerationConfig"]
    assert all(kw["revision"] == "v1" and kw["trust_remote_code"] is True for _, _, kw in calls)
    (engine,) = engines
    assert engine["revision"] == "v1" and engine["trust_remote_code"] is True
    assert backend.eos_ids == {
        2
    }  # the tiny model's <|im_end|>, from tokenizer and generation config
