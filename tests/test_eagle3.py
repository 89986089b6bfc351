"""The EAGLE-3 head, its reduced vocabulary and its speculators-format export."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.kinds.eagle3.export import load_eagle3, save_eagle3, validate_eagle3_export
from draftsmith.kinds.eagle3.head import (
    Eagle3Head,
    default_aux_layer_ids,
    head_inputs,
    layer_config_from_target,
    select_aux_hidden,
    shift_left,
)
from draftsmith.kinds.eagle3.vocab import (
    DraftVocab,
    build_draft_vocab,
    draft_logits_to_target,
    target_logits_on_draft_vocab,
    target_probs_on_draft_vocab,
    vocab_problem,
)
from draftsmith.models import tiny_llama_config

V = 64  # target vocabulary
VD = 24  # draft vocabulary
N_LAYERS = 8  # default aux ids (2, 4, 5)


@pytest.fixture(scope="module")
def target():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = tiny_llama_config(V, num_hidden_layers=N_LAYERS, tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLM"]  # as a loaded model's config has it
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def vocab() -> DraftVocab:
    g = torch.Generator().manual_seed(1)
    return build_draft_vocab(torch.randint(0, 50, (V,), generator=g), VD, V)


def make_head(target, vocab, norm_before_residual=False, seed=2) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head.from_target(target, vocab, norm_before_residual=norm_before_residual)
    # random norms too, so a swapped norm or a wrong residual cannot pass by accident
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return head.eval()


def features(target, ids: torch.Tensor, layer_ids, mask=None) -> torch.Tensor:
    with torch.no_grad():
        hs = target(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    return select_aux_hidden(hs, layer_ids)  # (B, N, 3d)


# ----------------------------------------------------------------------------- vocabulary


def test_build_draft_vocab_takes_most_frequent_ids_ties_by_id_sorted_by_target_id():
    counts = torch.tensor([5, 0, 7, 5, 1, 0, 7, 2])
    vocab = build_draft_vocab(counts, 4, 8)
    # by (-count, id): 2 (7), 6 (7), 0 (5), 3 (5); draft ids in ascending target id
    assert vocab.target_ids().tolist() == [0, 2, 3, 6]
    assert vocab.d2t.tolist() == [0, 1, 1, 3]  # target_id = draft_id + d2t[draft_id]
    assert vocab.d2t.dtype == torch.int64
    assert vocab.t2d.tolist() == [True, False, True, True, False, False, True, False]


def test_build_draft_vocab_fills_with_lowest_unseen_ids():
    vocab = build_draft_vocab(torch.tensor([0, 0, 3, 0, 0, 9]), 4, 6)
    assert vocab.target_ids().tolist() == [0, 1, 2, 5]


def test_build_draft_vocab_rejects_bad_sizes():
    with pytest.raises(ConfigError) as e:
        build_draft_vocab(torch.ones(8), 9, 8)
    assert str(e.value) == (
        "draft.eagle3.draft_vocab_size: 9 must be between 1 and the target's vocabulary size 8"
    )
    with pytest.raises(DraftsmithError) as e:
        build_draft_vocab(torch.ones(7), 4, 8)
    assert str(e.value) == (
        "token counts cover 7 ids but the target's vocabulary has 8: "
        "count with torch.bincount(ids, minlength=vocab_size)"
    )


def test_draft_logits_map_to_target_ids_and_nothing_else_can_be_proposed():
    vocab = build_draft_vocab(torch.tensor([0, 4, 0, 9, 7, 0]), 3, 6)  # target ids 1, 3, 4
    scores = draft_logits_to_target(torch.tensor([0.5, 2.0, -1.0]), vocab.d2t, 6)
    inf = float("-inf")
    assert scores.tolist() == [inf, 0.5, inf, 2.0, -1.0, inf]
    probs = torch.softmax(scores, -1)
    assert probs[~vocab.t2d].sum().item() == 0.0  # exactly zero, not small
    draws = torch.multinomial(
        probs, 2000, replacement=True, generator=torch.Generator().manual_seed(0)
    )
    assert set(draws.tolist()) == {1, 3, 4}
    assert int(scores.argmax()) == 3


def test_target_distribution_restricted_and_renormalised_to_the_draft_vocab():
    vocab = build_draft_vocab(torch.tensor([0, 5, 0, 6]), 2, 4)  # target ids 1, 3
    target_logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    restricted = target_logits_on_draft_vocab(target_logits, vocab.d2t)
    assert torch.allclose(restricted, torch.tensor([0.2, 0.4]).log())
    probs = target_probs_on_draft_vocab(target_logits, vocab.d2t)
    assert torch.allclose(probs, torch.tensor([1 / 3, 2 / 3]))
    # temperature 2: p^(1/2), renormalised over the two draft tokens
    hot = target_probs_on_draft_vocab(target_logits, vocab.d2t, temperature=2.0)
    a, b = math.sqrt(0.2), math.sqrt(0.4)
    assert torch.allclose(hot, torch.tensor([a / (a + b), b / (a + b)]))


def test_vocab_problem_names_a_d2t_that_disagrees_with_t2d():
    t2d = torch.tensor([False, True, False, True, True])  # target ids 1, 3, 4
    good = torch.tensor([1, 2, 2])
    assert vocab_problem(good, t2d) is None
    assert vocab_problem(torch.tensor([1, 2, 1]), t2d) == (
        "d2t does not match t2d: draft id 2 maps to target id 3 but the 2-th t2d token "
        "(ascending) is 4"
    )


# ----------------------------------------------------------------------------- the head


def test_aux_layer_ids_and_supported_targets():
    from transformers import GPT2Config

    assert default_aux_layer_ids(30) == [2, 15, 27]  # SmolLM2-135M
    with pytest.raises(ConfigError) as e:
        default_aux_layer_ids(4)
    assert str(e.value) == (
        "draft.eagle3.aux_layer_ids: the default [2, 2, 1] does not fit a target with 4 layers "
        "(it needs at least 7); set 3 distinct ids in [0, 3]"
    )
    with pytest.raises(ConfigError) as e:
        layer_config_from_target(GPT2Config())
    assert str(e.value) == (
        "draft.kind: eagle3 needs a Llama-family target (llama, mistral, qwen2, qwen3); "
        "this target is 'gpt2'"
    )


def test_aux_layer_id_i_is_the_input_of_decoder_layer_i(target):
    seen = {}
    hooks = [
        layer.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
        for i, layer in enumerate(target.model.layers)
    ]
    try:
        aux = features(target, torch.tensor([[3, 9, 4, 1]]), [0, 3, 7])
    finally:
        for h in hooks:
            h.remove()
    d = target.config.hidden_size
    assert torch.equal(aux[..., :d], seen[0])  # id 0: the embeddings
    assert torch.equal(aux[..., d : 2 * d], seen[3])
    assert torch.equal(aux[..., 2 * d :], seen[7])


def test_head_trains_its_own_weights_and_never_the_target_embeddings(target, vocab):
    head = make_head(target, vocab)
    embed = target.get_input_embeddings().weight
    assert all(p is not embed for p in head.parameters())
    assert set(head.state_dict()) == {
        "fc.weight",
        "d2t",
        "t2d",
        "norm.weight",
        "lm_head.weight",
        *(
            f"layers.0.{k}"
            for k in (
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.o_proj.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
                "input_layernorm.weight",
                "hidden_norm.weight",
                "post_attention_layernorm.weight",
            )
        ),
    }
    d = target.config.hidden_size
    assert head.layers[0].self_attn.q_proj.in_features == 2 * d
    assert head.fc.weight.shape == (d, 3 * d)
    assert head.lm_head.weight.shape == (VD, d)
    # started from the target's own output rows for the draft vocabulary, in draft id order
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[vocab.target_ids()])

    ids = torch.randint(0, V, (2, 7))
    tgt, aux, _ = head_inputs(ids, features(target, ids, head.aux_layer_ids))
    embed.grad = None
    head(tgt, aux_hidden=aux).logits.square().sum().backward()
    assert embed.grad is None
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_cached_steps_match_the_full_forward_also_after_a_crop(target, vocab, norm_before_residual):
    head = make_head(target, vocab, norm_before_residual)
    ids = torch.randint(0, V, (1, 14), generator=torch.Generator().manual_seed(3))
    tgt, aux, _ = head_inputs(ids, features(target, ids, head.aux_layer_ids))  # T = 13
    with torch.no_grad():
        full = head(tgt, aux_hidden=aux)  # (1, 13, VD)
        cache = head.new_cache()
        logits, hidden = head.step(cache, tgt[:, :6], aux_hidden=aux[:, :6])  # a prefill
        torch.testing.assert_close(logits, full.logits[:, 5], atol=1e-5, rtol=0)
        torch.testing.assert_close(hidden, full.hidden[:, 5], atol=1e-5, rtol=0)
        # three speculative steps on the head's own state, then all rejected
        for _ in range(3):
            tok = logits.argmax(-1, keepdim=True)  # (1, 1) a draft id, fed as a target id
            tok = tok + vocab.d2t[tok]
            logits, hidden = head.step(cache, tok, prev_hidden=hidden[:, None])
        assert cache.get_seq_length() == 9
        cache.crop(-3)  # as the engine crops: back to the 6 verified entries
        # the target verified 4 more tokens: their features arrive together, then one by one
        logits, _ = head.step(cache, tgt[:, 6:10], aux_hidden=aux[:, 6:10])
        torch.testing.assert_close(logits, full.logits[:, 9], atol=1e-5, rtol=0)
        for t in range(10, 13):
            logits, hidden = head.step(cache, tgt[:, t : t + 1], aux_hidden=aux[:, t : t + 1])
            torch.testing.assert_close(logits, full.logits[:, t], atol=1e-5, rtol=0)
            torch.testing.assert_close(hidden, full.hidden[:, t], atol=1e-5, rtol=0)


def test_training_time_test_step_j_is_decoding_after_j_speculative_steps(target, vocab):
    head = make_head(target, vocab)
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(4))
    tgt, aux, _ = head_inputs(ids, features(target, ids, head.aux_layer_ids))  # T = 11
    with torch.no_grad():
        outs = head.unroll(aux, tgt, None, steps=3)
        for t in (0, 4, 8):
            cache = head.new_cache()
            logits, hidden = head.step(cache, tgt[:, : t + 1], aux_hidden=aux[:, : t + 1])
            torch.testing.assert_close(logits, outs[0].logits[:, t], atol=1e-5, rtol=0)
            for j in (1, 2):
                # step j reads its own previous state and the next ground-truth token
                logits, hidden = head.step(
                    cache, tgt[:, t + j : t + j + 1], prev_hidden=hidden[:, None]
                )
                torch.testing.assert_close(logits, outs[j].logits[:, t], atol=1e-5, rtol=0)
                torch.testing.assert_close(hidden, outs[j].hidden[:, t], atol=1e-5, rtol=0)
    # the own state matters: feeding the target features again at step 1 gives other logits
    with torch.no_grad():
        again = head(shift_left(tgt, 1), aux_hidden=aux, context=outs[:1]).logits
    assert (again[:, :8] - outs[1].logits[:, :8]).abs().max() > 1e-3


def test_padding_on_either_side_gives_each_row_its_unpadded_logits(target, vocab):
    head = make_head(target, vocab)
    g = torch.Generator().manual_seed(5)
    long_ids, short_ids = (
        torch.randint(0, V, (1, 10), generator=g),
        torch.randint(0, V, (1, 7), generator=g),
    )
    with torch.no_grad():
        alone = []
        for x in (long_ids, short_ids):
            tgt, aux, _ = head_inputs(x, features(target, x, head.aux_layer_ids))
            alone.append(head.unroll(aux, tgt, None, steps=2))
        for side in ("right", "left"):
            pad = torch.zeros(1, 3, dtype=torch.long)
            short = torch.cat([short_ids, pad] if side == "right" else [pad, short_ids], dim=1)
            ids = torch.cat([long_ids, short])  # (2, 10)
            mask = torch.ones(2, 10, dtype=torch.long)
            pads = slice(7, 10) if side == "right" else slice(0, 3)
            mask[1, pads] = 0
            aux = features(target, ids, head.aux_layer_ids, mask)
            tgt, aux, head_mask = head_inputs(ids, aux, mask)
            outs = head.unroll(aux, tgt, attention_mask=head_mask, steps=2)
            # real positions of the short row (6 of them); step j has targets for 6 - j
            real = slice(0, 6) if side == "right" else slice(3, 9)
            for j in range(2):
                torch.testing.assert_close(
                    outs[j].logits[:1], alone[0][j].logits, atol=1e-5, rtol=0
                )
                got = outs[j].logits[1:, real][:, : 6 - j]
                torch.testing.assert_close(got, alone[1][j].logits[:, : 6 - j], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- export


def test_export_writes_the_speculators_layout_and_loads_back(tmp_path, target, vocab):
    from safetensors.torch import load_file

    head = make_head(target, vocab)
    out = save_eagle3(head, tmp_path / "exp", target.config, "org/target", k=3)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["draft_vocab_size"] == VD
    assert cfg["norm_before_residual"] is False
    assert cfg["target_hidden_size"] == 64
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    layer = cfg["transformer_layer_config"]
    assert (layer["model_type"], layer["vocab_size"], layer["num_hidden_layers"]) == ("llama", V, 1)
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["default_proposal_method"] == spec["proposal_methods"][0]["proposal_type"]
    assert spec["verifier"] == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "eagle3",
        "model": str(out.resolve()),
        "num_speculative_tokens": 3,
    }
    weights = load_file(out / "model.safetensors")
    assert "embed_tokens.weight" not in weights  # the target's are shared at load time
    assert torch.equal(weights["d2t"], vocab.d2t) and torch.equal(weights["t2d"], vocab.t2d)

    loaded = load_eagle3(out, target)
    ids = torch.randint(0, V, (1, 9))
    tgt, aux, _ = head_inputs(ids, features(target, ids, head.aux_layer_ids))
    with torch.no_grad():
        assert torch.equal(loaded(tgt, aux_hidden=aux).logits, head(tgt, aux_hidden=aux).logits)
    assert loaded.aux_layer_ids == [2, 4, 5]


def test_export_refuses_an_existing_dir(tmp_path, target, vocab):
    (tmp_path / "exp").mkdir()
    with pytest.raises(DraftsmithError) as e:  # exit 1, as the export stage's own check
        save_eagle3(make_head(target, vocab), tmp_path / "exp", target.config, "t", k=2)
    assert type(e.value) is DraftsmithError
    assert str(e.value) == (
        f"{tmp_path / 'exp'}: export dir exists; set export.overwrite=true to replace it"
    )
    assert list((tmp_path / "exp").iterdir()) == []


def _rewrite_weights(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    edit(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def _fails_with(path: Path, problem: str) -> None:
    with pytest.raises(DraftsmithError) as e:
        validate_eagle3_export(path)
    assert str(e.value) == f"{path / 'model.safetensors'}: {problem}"


def test_validation_names_a_missing_d2t(tmp_path, target, vocab):
    out = save_eagle3(make_head(target, vocab), tmp_path / "exp", target.config, "t", k=2)
    _rewrite_weights(out, lambda w: w.pop("d2t"))
    _fails_with(
        out,
        f"d2t missing: vLLM then maps draft id i onto target id i (the first {VD} ids); "
        "save the d2t offsets",
    )


def test_validation_names_a_d2t_written_as_arange(tmp_path, target, vocab):
    out = save_eagle3(make_head(target, vocab), tmp_path / "exp", target.config, "t", k=2)
    _rewrite_weights(out, lambda w: w.__setitem__("d2t", torch.arange(VD)))
    _fails_with(
        out,
        "d2t is arange(draft_vocab_size) instead of offsets (target_id = draft_id + "
        "d2t[draft_id]): store target_ids - arange",
    )
    _rewrite_weights(out, lambda w: w.__setitem__("d2t", vocab.target_ids()))
    _fails_with(
        out,
        "d2t holds the target ids themselves instead of offsets (target_id = draft_id + "
        "d2t[draft_id]): store target_ids - arange",
    )
    _rewrite_weights(out, lambda w: w.__setitem__("d2t", torch.zeros(VD, dtype=torch.long)))
    _fails_with(
        out,
        f"d2t is all zeros: every draft id i would map to target id i (the first {VD} ids), "
        "not to the t2d tokens; store offsets target_id - draft_id",
    )


def test_validation_names_a_full_vocabulary_lm_head(tmp_path, target, vocab):
    out = save_eagle3(make_head(target, vocab), tmp_path / "exp", target.config, "t", k=2)
    _rewrite_weights(
        out, lambda w: w.__setitem__("lm_head.weight", target.lm_head.weight.detach().clone())
    )
    _fails_with(
        out,
        f"lm_head.weight has {V} rows (the target's full vocabulary) instead of "
        f"draft_vocab_size={VD}: export the trained reduced head",
    )


def test_validation_checks_shapes_and_save_never_lands_a_bad_export(tmp_path, target, vocab):
    out = save_eagle3(make_head(target, vocab), tmp_path / "exp", target.config, "t", k=2)
    _rewrite_weights(out, lambda w: w.__setitem__("fc.weight", torch.zeros(64, 128)))
    _fails_with(out, "fc.weight has shape (64, 128), expected (64, 192)")

    head = make_head(target, vocab)
    head.lm_head = torch.nn.Linear(64, V, bias=False)  # the target-sized head by mistake
    with pytest.raises(DraftsmithError) as e:
        save_eagle3(head, tmp_path / "bad", target.config, "t", k=2)
    assert str(e.value) == (
        f"eagle3 export {tmp_path / 'bad'}: lm_head.weight has {V} rows (the target's full "
        f"vocabulary) instead of draft_vocab_size={VD}: export the trained reduced head"
    )
    assert list(tmp_path.iterdir()) == [tmp_path / "exp"]  # no bad dir, no temp dir


# ----------------------------------------------------------------------------- speculators

# speculators 0.9.0 plus the three small packages `import speculators` and its
# from_pretrained need (train/data.py imports openai and hs_connectors at import time,
# utils/loading.py loguru). Unpacked into a cache dir and used from a subprocess: its
# declared dependencies (a CUDA torch, transformers<=5.19) are never installed.
SPECULATORS = "speculators==0.9.0"
SPECULATORS_DEPS = ("openai==3.60.0", "loguru==0.7.3", "hs-connectors==0.9.0")
LOCAL_WHEEL = Path("/tmp/pkgs/speculators-0.9.0-py3-none-any.whl")


@pytest.fixture(scope="session")
def speculators_site() -> Path:
    from draftsmith.io import atomic_dir
    from draftsmith.models import draftsmith_home

    site = draftsmith_home() / "test-deps" / "speculators-0.9.0"
    if (site / "speculators" / "__init__.py").is_file():
        return site
    with atomic_dir(site, overwrite=True) as tmp:
        wheels = tmp / "_wheels"
        wheels.mkdir()
        reqs = list(SPECULATORS_DEPS)
        if LOCAL_WHEEL.is_file():
            shutil.copy2(LOCAL_WHEEL, wheels)
        else:
            reqs.append(SPECULATORS)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels)]
        r = subprocess.run(cmd + reqs, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            pytest.skip(f"speculators 0.9.0 not obtainable (pip download failed: {last[0]})")
        for whl in wheels.glob("*.whl"):
            with zipfile.ZipFile(whl) as z:
                z.extractall(tmp)
        shutil.rmtree(wheels)
    return site


# Loads each export with speculators, saves its state dict and the logits of its own
# training-time-test forward (3 steps, eager attention) for the parent to compare.
SPECULATORS_SCRIPT = r"""
import sys, torch
from safetensors.torch import save_file
from speculators import SpeculatorModel, SpeculatorModelConfig

for path in sys.argv[1:]:
    model = SpeculatorModel.from_pretrained(path)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path + "/loaded.safetensors", metadata={"class": type(model).__name__})
    cfg = SpeculatorModelConfig.from_pretrained(path)
    cfg.transformer_layer_config._attn_implementation = "eager"
    model = SpeculatorModel.from_pretrained(path, config=cfg).eval()
    data = torch.load(path + "/inputs.pt", weights_only=True)
    logits = []
    model.lm_head.register_forward_hook(lambda m, i, o: logits.append(o.detach()))
    T = data["ids"].shape[1]
    with torch.no_grad():
        model(hidden_states=data["aux"], input_ids=data["ids"],
              document_ids=torch.zeros(1, T, dtype=torch.long), ttt_steps=3)
    save_file({f"step{j}": x.contiguous() for j, x in enumerate(logits)}, path + "/ttt.safetensors")
"""


def test_speculators_loads_the_export_as_we_wrote_it(tmp_path, target, vocab, speculators_site):
    import os

    from safetensors import safe_open
    from safetensors.torch import load_file

    verifier = tmp_path / "verifier"
    target.save_pretrained(verifier)
    # (norm_before_residual, include_embeddings): the layouts a user can export
    cases = [(False, False), (False, True), (True, True)]
    heads, inputs, dirs = [], [], []
    for i, (nbr, emb) in enumerate(cases):
        head = make_head(target, vocab, norm_before_residual=nbr, seed=7 + i)
        out = save_eagle3(
            head, tmp_path / f"exp{i}", target.config, str(verifier), k=3, include_embeddings=emb
        )
        ids = torch.randint(0, V, (1, 10), generator=torch.Generator().manual_seed(8))
        tgt, aux, _ = head_inputs(ids, features(target, ids, head.aux_layer_ids))
        torch.save({"aux": aux, "ids": tgt}, out / "inputs.pt")
        heads.append(head)
        inputs.append((tgt, aux))
        dirs.append(str(out))

    env = {**os.environ, "PYTHONPATH": str(speculators_site), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", SPECULATORS_SCRIPT, *dirs],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    for (_, emb), head, (tgt, aux), path in zip(cases, heads, inputs, dirs):
        with safe_open(f"{path}/loaded.safetensors", "pt") as f:
            assert f.metadata()["class"] == "Eagle3DraftModel"
        loaded = load_file(f"{path}/loaded.safetensors")
        # every draft id maps to the intended target id through the loaded d2t
        mapped = torch.arange(VD) + loaded["d2t"]
        assert torch.equal(mapped, vocab.target_ids())
        assert torch.equal(loaded["t2d"], vocab.t2d)
        for name, w in head.state_dict().items():
            assert torch.equal(loaded[name], w), name
        if not emb:
            # speculators' fill-from-verifier of a missing embed_tokens is not reliable
            # (see draftsmith.kinds.eagle3.export): nothing more to compare without our embeddings
            continue
        assert torch.equal(loaded["embed_tokens.weight"], target.get_input_embeddings().weight)
        # speculators' own training-time-test forward gives our logits at every step
        with torch.no_grad():
            ours = head.unroll(aux, tgt, None, steps=3)
        theirs = load_file(f"{path}/ttt.safetensors")
        for j in range(3):
            torch.testing.assert_close(theirs[f"step{j}"], ours[j].logits, atol=1e-5, rtol=0)
