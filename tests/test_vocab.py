"""A draft with fewer vocabulary rows than the target, one tokenizer, end to end.

Tiny random Llamas shaped like Qwen2.5-0.5B (151936 rows) and -7B (152064 rows) over one
tokenizer (151665 ids): draft 288 rows, target 320, both over the byte tokenizer's 259
ids, so rows 259.. are padding (draftsmith/vocab_rows.py). Before the fix every divergence
loss died at step 1 on the shapes, the offline teacher indexed past the draft's rows,
sampled evaluation crashed in the sampler and the export kept 288 rows.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from test_distill_helpers import make_cfg, write_dataset  # noqa: E402

from draftsmith.config import config_from_dict  # noqa: E402
from draftsmith.distill.losses import TopK, distill_loss  # noqa: E402
from draftsmith.distill.stage import run_distill  # noqa: E402
from draftsmith.errors import DraftsmithError  # noqa: E402
from draftsmith.evaluate.engine import SpeculativeDecoder  # noqa: E402
from draftsmith.sampling import SamplingConfig  # noqa: E402
from draftsmith.vocab_rows import match_vocab_rows, token_id_count  # noqa: E402

NUM_IDS, DRAFT_ROWS, TARGET_ROWS = 259, 288, 320


def _tiny(dest: Path, rows: int, seed: int, tie: bool = True):
    from transformers import LlamaForCausalLM

    from draftsmith.models import build_byte_tokenizer, tiny_llama_config

    tok = build_byte_tokenizer()
    torch.manual_seed(seed)
    cfg = tiny_llama_config(
        rows,
        hidden_size=32,
        intermediate_size=64,
        initializer_range=0.2,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vocab")
    _tiny(root / "target", TARGET_ROWS, seed=0, tie=False)
    _tiny(root / "draft", DRAFT_ROWS, seed=1)
    write_dataset(root / "src", root / "target", n=8, k=8, num_ids=NUM_IDS)
    import datasets

    stored = datasets.load_from_disk(str(root / "src" / "data" / "dataset"))["topk_ids"]
    # the offline case below is only a test if the target ranks padding rows in its top-k
    assert max(i for row in stored for pos in row for i in pos) >= DRAFT_ROWS
    return {"root": root, "target": root / "target", "draft": root / "draft"}


def _run_dir(pair: dict, name: str) -> Path:
    out = pair["root"] / name
    (out / "data").mkdir(parents=True)
    os.symlink(pair["root"] / "src" / "data" / "dataset", out / "data" / "dataset")
    (out / "data" / "meta.json").write_text((pair["root"] / "src/data/meta.json").read_text())
    return out


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("tie", [True, False])
def test_match_vocab_rows_pads_keeps_real_rows_and_fills_the_mean(tmp_path, tie):
    model = _tiny(tmp_path / "m", DRAFT_ROWS, seed=3, tie=tie)
    emb = model.get_input_embeddings().weight[:NUM_IDS].clone()
    head = model.get_output_embeddings().weight[:NUM_IDS].clone()
    match_vocab_rows(model, TARGET_ROWS, NUM_IDS)
    assert model.config.vocab_size == TARGET_ROWS
    e, h = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert e.shape[0] == h.shape[0] == TARGET_ROWS
    assert (e.data_ptr() == h.data_ptr()) == tie  # tied stays tied
    assert torch.equal(e[:NUM_IDS], emb) and torch.equal(h[:NUM_IDS], head)
    torch.testing.assert_close(h[NUM_IDS:], head.mean(0).expand(TARGET_ROWS - NUM_IDS, -1))
    match_vocab_rows(model, 270, NUM_IDS)  # trimming drops padding rows only
    assert model.config.vocab_size == 270 and torch.equal(model.lm_head.weight[:NUM_IDS], head)
    with pytest.raises(DraftsmithError, match="^m: the target has 258 vocabulary rows but the"):
        match_vocab_rows(model, 258, NUM_IDS, key="m")


def test_a_mean_padding_row_is_the_mean_logit_so_never_the_argmax(tmp_path):
    """For runtimes that do not cut padding rows (vLLM): logit of the mean row = mean logit."""
    model = _tiny(tmp_path / "m", DRAFT_ROWS, seed=4, tie=False)
    match_vocab_rows(model, TARGET_ROWS, NUM_IDS)
    ids = torch.randint(0, NUM_IDS, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits  # (4, 24, 320)
    real, pad = logits[..., :NUM_IDS], logits[..., NUM_IDS:]
    torch.testing.assert_close(pad, real.mean(-1, keepdim=True).expand_as(pad))
    assert (logits.argmax(-1) < NUM_IDS).all()


# ----------------------------------------------------------------------------- distill

CASES = [("online", loss) for loss in ("forward_kl", "reverse_kl", "jsd", "tvd", "ce")] + [
    ("offline", loss) for loss in ("forward_kl", "reverse_kl", "jsd", "tvd")
]


def _expected_first_loss(pair: dict, draft_dir: Path, teacher: str, loss: str, temp: float):
    """The token-mean loss of the untrained draft on all 8 sequences, computed independently:
    both models' logits cut to the tokenizer's 259 ids; the stored top-k as it is."""
    import datasets

    rows = datasets.load_from_disk(str(pair["root"] / "src" / "data" / "dataset"))
    draft, target = _load(draft_dir), _load(pair["target"])
    total, count = 0.0, 0
    for r in rows:
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        ids = torch.tensor([r["prompt_ids"] + r["completion_ids"]])
        with torch.no_grad():
            s = draft(ids).logits[0, p - 1 : p + c - 1, :NUM_IDS]  # (C, 259)
            t = target(ids).logits[0, p - 1 : p + c - 1, :NUM_IDS]
        signal = t
        if teacher == "offline":
            signal = TopK(torch.tensor(r["topk_ids"]), torch.tensor(r["topk_logprobs"]))
        labels = torch.tensor(r["completion_ids"])
        out = distill_loss(
            loss, s, signal, labels, torch.ones(c, dtype=torch.bool), temperature=temp
        )
        total, count = total + out.total.item(), count + c
    return total / count


@pytest.mark.parametrize("teacher,loss", CASES)
def test_distill_pads_the_draft_and_trains_with_every_loss_and_teacher(pair, teacher, loss):
    out = _run_dir(pair, f"run-{teacher}-{loss}")
    cfg = make_cfg(
        out,
        pair["target"],
        teacher=teacher,
        loss=loss,
        max_steps=1,
        save_every=1,
        batch_size=8,
        warmup_steps=0,
    )
    cfg.draft.init, cfg.draft.model = "pretrained", str(pair["draft"])
    cfg.distill.temperature = 1.0 if loss == "ce" else 2.0
    run_distill(cfg)
    ck0, ck1 = out / "checkpoints" / "checkpoint-0", out / "checkpoints" / "checkpoint-1"
    for ck in (ck0, ck1):
        assert json.loads((ck / "config.json").read_text())["vocab_size"] == TARGET_ROWS
    # checkpoint-0: the pretrained draft's real rows untouched; padding rows (its own 259..287
    # and the new 288..319) their mean
    init, orig = (
        load_file(ck0 / "model.safetensors"),
        load_file(pair["draft"] / "model.safetensors"),
    )
    emb = "model.embed_tokens.weight"
    assert init[emb].shape[0] == TARGET_ROWS and torch.equal(
        init[emb][:NUM_IDS], orig[emb][:NUM_IDS]
    )
    pad = init[emb][NUM_IDS:]
    torch.testing.assert_close(pad, orig[emb][:NUM_IDS].mean(0).expand_as(pad))
    # step 1's loss is the loss of the untrained draft on the 259 real ids (batch = all data)
    hist = json.loads((ck1 / "draftsmith_checkpoint.json").read_text())["loss_history"]
    want = _expected_first_loss(pair, ck0, teacher, loss, cfg.distill.temperature)
    assert hist[0] == pytest.approx(want, rel=1e-4)
    trained = load_file(ck1 / "model.safetensors")
    assert not torch.equal(trained[emb][:NUM_IDS], init[emb][:NUM_IDS])  # it trained


def test_tokenizer_disagreement_is_one_error_naming_the_token(pair, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    _tiny(other, DRAFT_ROWS, seed=5)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<tool>"])
    tok.save_pretrained(other)
    out = _run_dir(pair, "run-mismatch")
    cfg = make_cfg(out, pair["target"], teacher="offline", max_steps=1, save_every=1)
    cfg.draft.init, cfg.draft.model = "pretrained", str(other)
    with pytest.raises(
        DraftsmithError, match="token '<tool>' has no id in the target and id 259 in the draft"
    ):
        run_distill(cfg)


# ----------------------------------------------------------------------------- the engine


def _boost_padding(model) -> None:
    """An adversary: every padding logit +1e4, whatever the weights (a forward hook)."""

    def hook(_module, _inputs, logits):
        logits = logits.clone()
        logits[..., NUM_IDS:] += 1e4
        return logits

    model.get_output_embeddings().register_forward_hook(hook)


def _decode(target, draft, k: int, temperature: float, seed: int, n: int = 24):
    dec = SpeculativeDecoder(
        target,
        draft,
        k=k,
        sampling=SamplingConfig(temperature=temperature),
        num_ids=NUM_IDS,
        linear_forms=False,
    )
    return dec.generate([5, 70, 80, 90], n, seed=seed)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_with_a_smaller_draft_greedy_and_sampled(pair, temperature):
    target = _load(pair["target"])
    # the target itself on 288 rows: on the real ids it IS the target, so exact speculative
    # sampling must accept every drafted token, at any temperature
    same = _load(pair["target"])
    match_vocab_rows(same, DRAFT_ROWS, NUM_IDS)
    other = _load(pair["draft"])  # an independent 288-row draft
    for seed in range(3):
        res = _decode(target, same, 3, temperature, seed)
        assert res.accepted == res.proposed > 0
        alone = _decode(target, None, 0, temperature, seed)
        spec = _decode(target, other, 3, temperature, seed)
        assert max(alone.tokens + spec.tokens) < NUM_IDS
        if temperature == 0.0:
            assert spec.tokens == alone.tokens == res.tokens  # lossless


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_never_emits_padding_ids_whatever_their_logits(pair, temperature):
    target, draft = _load(pair["target"]), _load(pair["draft"])
    clean = [_decode(target, draft, 3, temperature, seed).tokens for seed in range(3)]
    _boost_padding(target)
    _boost_padding(draft)
    with torch.no_grad():  # the adversary works: uncut, a padding id would win everywhere
        assert (draft(torch.tensor([[5, 70, 80]])).logits.argmax(-1) >= NUM_IDS).all()
    boosted = [_decode(target, draft, 3, temperature, seed).tokens for seed in range(3)]
    assert boosted == clean  # the cut removes the padding rows entirely


# ----------------------------------------------------------------------------- after training


@pytest.fixture(scope="module")
def trained(pair) -> Path:
    """A pretrained 288-row draft trained 3 steps (online forward_kl, on-policy included)."""
    out = _run_dir(pair, "run-trained")
    cfg = make_cfg(out, pair["target"], max_steps=3, save_every=3, lr=1e-2, on_policy_fraction=0.5)
    cfg.draft.init, cfg.draft.model = "pretrained", str(pair["draft"])
    run_distill(cfg)
    return out


def test_after_training_no_padding_id_is_proposed_sampled_or_emitted(pair, trained):
    from draftsmith.distill.batching import Example
    from draftsmith.distill.teacher import sample_completions

    ck = trained / "checkpoints" / "checkpoint-3"
    target, draft = _load(pair["target"]), _load(ck)
    assert draft.config.vocab_size == TARGET_ROWS
    _boost_padding(draft)
    for temperature in (0.0, 1.0):
        for seed in range(3):
            res = _decode(target, draft, 4, temperature, seed)
            assert max(res.tokens) < NUM_IDS
    examples = [Example([5, 70, 80], [1] * 16), Example([90, 91], [1] * 16)]
    for seed in range(3):  # on-policy sampling, as training does it
        samples = sample_completions(
            draft,
            examples,
            temperature=1.0,
            pad_id=0,
            eos_id=None,
            seed=seed,
            device=torch.device("cpu"),
            num_ids=NUM_IDS,
        )
        assert max(t for s in samples for t in s.completion_ids) < NUM_IDS


def _export(pair: dict, out: Path, ck: Path) -> Path:
    from draftsmith.evaluate.records import LeaderboardRow
    from draftsmith.export import run_export

    (out / "eval").mkdir(parents=True, exist_ok=True)
    row = LeaderboardRow(
        checkpoint=ck.name,
        path=str(ck),
        step=0,
        role=None,  # no training record to read: the card says so
        kind="independent",
        trained_steps=0,
        eval_set="heldout",
        measured_by="teacher_forced",
        num_speculative_tokens=3,
        temperature=0.0,
        backend="native",
    )
    board = {"best": ck.name, "rows": [row.to_dict()]}
    (out / "eval" / "leaderboard.json").write_text(json.dumps(board))
    cfg = config_from_dict(
        {
            "run": {"output_dir": str(out), "device": "cpu"},
            "target": {"model": str(pair["target"])},
            "tracking": {"wandb": {"mode": "disabled"}},
        }
    )
    return run_export(cfg)


def test_export_has_the_targets_vocab_size_and_mean_padding_rows(pair, trained):
    ck = trained / "checkpoints" / "checkpoint-3"
    exported = _export(pair, trained, ck)
    assert json.loads((exported / "config.json").read_text())["vocab_size"] == TARGET_ROWS
    card = (exported / "README.md").read_text()  # a row of no role: no record read, said so
    assert "- training: not trained by this run (no checkpoint record)" in card
    src, dst = load_file(ck / "model.safetensors"), load_file(exported / "model.safetensors")
    emb = "model.embed_tokens.weight"
    assert torch.equal(dst[emb][:NUM_IDS], src[emb][:NUM_IDS])  # the trained rows as evaluated
    pad = dst[emb][NUM_IDS:]
    torch.testing.assert_close(pad, src[emb][:NUM_IDS].mean(0).expand_as(pad))
    model = _load(exported)
    ids = torch.randint(0, NUM_IDS, (4, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(ids).logits.argmax(-1) < NUM_IDS).all()  # vLLM, which does not cut


def test_export_pads_an_external_smaller_draft(pair, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    exported = _export(pair, out, pair["draft"])  # e.g. an evaluate.baselines row
    assert json.loads((exported / "config.json").read_text())["vocab_size"] == TARGET_ROWS
    src, dst = (
        load_file(pair["draft"] / "model.safetensors"),
        load_file(exported / "model.safetensors"),
    )
    emb = "model.embed_tokens.weight"
    assert dst[emb].shape[0] == TARGET_ROWS and torch.equal(dst[emb][:NUM_IDS], src[emb][:NUM_IDS])
    assert token_id_count(AutoTokenizer.from_pretrained(exported)) == NUM_IDS
