"""vLLM backend: the metric conversion on CPU with recorded metric objects; the real run on GPU."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace

import pytest
from board_rows import VLLM_COUNTS

from draftsmith.config import config_from_dict
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import vllm_backend as vb
from draftsmith.evaluate.records import DraftEntry
from draftsmith.kinds import get_kind


@dataclass
class Counter:  # mimics vllm.v1.metrics.reader.Counter
    name: str
    value: int
    labels: dict = field(default_factory=dict)


@dataclass
class Vector:  # mimics vllm.v1.metrics.reader.Vector
    name: str
    values: list
    labels: dict = field(default_factory=dict)


def _snapshot(drafts, draft_tokens, accepted, per_pos, engines=1):
    out = [Counter("vllm:generation_tokens", 999)]
    for e in range(engines):
        lab = {"engine": str(e)}
        out += [
            Counter("vllm:spec_decode_num_drafts", drafts, lab),
            Counter("vllm:spec_decode_num_draft_tokens", draft_tokens, lab),
            Counter("vllm:spec_decode_num_accepted_tokens", accepted, lab),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", per_pos, lab),
        ]
    return out


def test_spec_counts_sum_engines_and_delta():
    before = vb.spec_counts(_snapshot(2, 6, 3, [2, 1, 0]), k=3)
    after = vb.spec_counts(_snapshot(12, 36, 21, [10, 7, 4], engines=2), k=3)
    assert after == {
        "num_drafts": 24,
        "num_draft_tokens": 72,
        "num_accepted_tokens": 42,
        "accepted_per_pos": [20, 14, 8],
    }
    d = vb.counts_delta(after, before)
    assert d == {
        "num_drafts": 22,
        "num_draft_tokens": 66,
        "num_accepted_tokens": 39,
        "accepted_per_pos": [18, 13, 8],
    }


def test_summary_from_counts_hand_computed():
    s = vb.summary_from_counts(VLLM_COUNTS, 3, tokens=25, wall=0.5, base_tokens=25, base_wall=1.0)
    assert s["acceptance_rate"] == 0.5
    assert s["mean_accepted_length"] == 2.5
    assert s["per_position_acceptance"] == [0.8, 5 / 8, 2 / 5]
    assert s["alpha"] == 15 / (10 + 8 + 5)  # accepted / verified (10 first, 8 second, 5 third)
    assert s["speedup"] == 2.0 and s["target_forwards"] == 10
    assert s["draft_cost_ratio"] is None and s["modelled_speedup"] is None


def test_missing_vllm_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_vllm(name, *a, **kw):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(DraftsmithError, match="evaluate.backend: 'vllm' needs vLLM >= 0.15.0"):
        vb.vllm_rows(config_from_dict({"evaluate": {"backend": "vllm"}}), [], [])


def test_engine_asks_vllm_for_the_draft_at_the_targets_tensor_parallel_size():
    seen = {}

    class FakeLLM:
        def __init__(self, **kw):
            seen.update(kw)

    fake = SimpleNamespace(LLM=FakeLLM)
    cfg = config_from_dict(
        {
            "target": {"model": "org/target", "revision": "v2", "trust_remote_code": True},
            "evaluate": {"backend": "vllm", "vllm": {"tensor_parallel_size": 4}},
        }
    )
    spec = get_kind("independent").vllm_speculative_config(cfg, "/drafts/d", 3)
    vb._make_llm(fake, cfg, "org/target", spec)
    assert seen["speculative_config"] == {
        "method": "draft_model",
        "model": "/drafts/d",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 4,
    }
    assert seen["tensor_parallel_size"] == 4 and seen["model"] == "org/target"
    assert seen["revision"] == "v2" and seen["trust_remote_code"] is True
    assert seen["disable_log_stats"] is False and "max_model_len" not in seen
    vb._make_llm(
        fake, cfg, "org/target", get_kind("eagle3").vllm_speculative_config(cfg, "/drafts/e", 2)
    )
    assert seen["speculative_config"] == {
        "method": "eagle3",
        "model": "/drafts/e",
        "num_speculative_tokens": 2,
    }


@pytest.mark.gpu
def test_vllm_backend_perfect_draft(tmp_path):
    pytest.importorskip("vllm")
    from draftsmith.config import config_from_dict
    from draftsmith.evaluate.prompts import list_drafts
    from draftsmith.models import resolve_model

    target = resolve_model("smollm2-135m-instruct")
    cfg = config_from_dict(
        {
            "run": {"output_dir": str(tmp_path)},
            "target": {"model": target},
            "evaluate": {
                "backend": "vllm",
                "baselines": [target],
                "k_sweep": [2],
                "max_new_tokens": 32,
                "on_mismatch": "warn",
            },
        }
    )
    prompts = [{"id": "a", "category": "x", "prompt_ids": [1, 504, 3458, 314]}]
    drafts = list_drafts(tmp_path, ["independent"], [target, "target"], target=target)
    rows, best, sweep = vb.vllm_rows(cfg, {"heldout": prompts}, drafts)
    assert rows[0].acceptance_rate > 0.9 and sweep[0]["k"] == 2
    assert (rows[0].eval_set, rows[0].measured_by) == ("heldout", "engine")
    # evaluate.baselines: [target] in vLLM: every drafted token accepted, never the best
    from draftsmith.evaluate.board import check_self_draft

    assert rows[1].role == "sanity" and best.checkpoint != "target-as-draft"
    assert check_self_draft(rows, "error") == [
        {"eval_set": "heldout", "measured_by": "engine", "pass": True}
    ]


def test_vllm_rows_cover_every_eval_set_and_sweep_the_primary_one(monkeypatch):
    """Recorded counters from a fake vLLM: one engine per draft and k, run on every set."""
    engines = []

    class FakeLLM:
        def __init__(self, **kw):
            spec = kw["speculative_config"]
            self.k = spec["num_speculative_tokens"] if spec else 0
            self.drafts = 0
            engines.append((spec["model"] if spec else None, self.k))

        def get_metrics(self):  # each prompt: 2 rounds, k drafts each, 1 accepted per round
            n = self.drafts
            return _snapshot(n, n * self.k, n, [n] + [0] * (self.k - 1)) if self.k else []

        def generate(self, prompts, params, use_tqdm):
            self.drafts += 2 * len(prompts)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5, 6, 7, 8])])] * len(
                prompts
            )

    fake = ModuleType("vllm")
    fake.LLM, fake.SamplingParams = FakeLLM, lambda **kw: kw
    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setattr(vb, "import_vllm", lambda key: fake)
    monkeypatch.setattr(vb, "resolve_model", lambda ref, key=None: ref)
    monkeypatch.setattr(vb, "draft_path", lambda d: d.ref)
    cfg = config_from_dict({"evaluate": {"backend": "vllm", "k_sweep": [1, 3]}})
    cfg.evaluate.num_speculative_tokens = 3
    p = {"category": "c", "prompt_ids": [1, 2]}
    sets = {"mtbench": [p, p, p], "heldout": [p]}
    drafts = [
        DraftEntry(name=n, ref=f"/d/{n}", step=s, trained_steps=s, kind="independent")
        for n, s in (("a", 1), ("b", 2))
    ]
    rows, best, sweep = vb.vllm_rows(cfg, sets, drafts, "mtbench")
    assert [(r.eval_set, r.checkpoint) for r in rows] == [
        ("mtbench", "a"),
        ("mtbench", "b"),
        ("heldout", "a"),
        ("heldout", "b"),
    ]
    assert {r.measured_by for r in rows} == {"engine"}
    assert [r.num_prompts for r in rows] == [3, 3, 1, 1]
    assert rows[0].acceptance_rate == 1 / 3 and rows[0].mean_accepted_length == 2.0
    # the target once, each draft at k=3 once (all sets), the best draft at k=1 for the sweep
    assert engines == [(None, 0), ("/d/a", 3), ("/d/b", 3), ("/d/a", 1)]
    assert [s["k"] for s in sweep] == [1, 3] and sweep[1]["acceptance_rate"] == 1 / 3
