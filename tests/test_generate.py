"""The generate stage: HF backend behaviour, the stage's files, resume after SIGKILL, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import datasets
import pytest
import torch
from transformers import LlamaForCausalLM

from draftsmith.config import DataConfig, PromptSource, load_config
from draftsmith.data import load_eval_prompts, load_train_dataset
from draftsmith.data.completion import cut_at_eos
from draftsmith.data.generate import run_generate
from draftsmith.data.hf_backend import HFBackend, left_pad, length_buckets
from draftsmith.errors import DraftsmithError
from draftsmith.models import build_byte_tokenizer, tiny_llama_config

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["hello", "the quick brown fox jumps", "a", "numbers 1 2 3 4 5 6", "why?", "zz top"]


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A 2-layer random Llama whose greedy outputs vary by prompt (weights scaled up)."""
    torch.manual_seed(0)
    cfg = tiny_llama_config(
        len(tok),
        num_hidden_layers=2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)
    return m


def prompts_of(tok):
    return [tok(t)["input_ids"] for t in TEXTS]


def backend(model, tok, **kw) -> HFBackend:
    return HFBackend(model, tok, DataConfig(**{"max_new_tokens": 12, "batch_size": 4, **kw}))


# ----------------------------------------------------------------------------- HF backend


def test_cut_at_eos_keeps_eos_and_drops_what_follows():
    assert cut_at_eos([5, 6, 2, 0, 0], {2}) == (3, "stop")
    assert cut_at_eos([5, 6, 7], {2}) == (3, "length")
    assert cut_at_eos([2, 2], {2, 9}) == (1, "stop")


def test_left_pad_and_length_buckets():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert length_buckets([5, 1, 9, 3, 7], 2) == [[1, 3], [0, 4], [2]]
    # a token cap: rows x (longest + 4 new tokens) <= 30: three short rows, then two long
    assert length_buckets([5, 1, 9, 3, 7], 4, max_tokens=30, extra=4) == [[1, 3, 0], [4, 2]]
    assert length_buckets([50], 4, max_tokens=24, extra=4) == [[0]]  # one row always fits


def test_batched_greedy_equals_one_prompt_at_a_time(model, tok):
    prompts = prompts_of(tok)
    batched = backend(model, tok, batch_size=4, topk_logprobs=5).generate(prompts, seed=0)
    single = backend(model, tok, batch_size=1, topk_logprobs=5).generate(prompts, seed=0)
    for b, s in zip(batched, single):
        assert b[0].token_ids == s[0].token_ids
        assert torch.allclose(
            torch.tensor(b[0].topk_logprobs), torch.tensor(s[0].topk_logprobs), atol=1e-4
        )
    assert len({tuple(c[0].token_ids) for c in batched}) == len(prompts)  # outputs vary by prompt


def test_greedy_equals_transformers_generate_with_rows_ending_early(model, tok):
    """The decode loop drops rows at EOS and grows its cache in place; the text must not move."""
    prompts = prompts_of(tok)
    free = [c[0].token_ids for c in backend(model, tok, batch_size=8).generate(prompts, seed=0)]
    eos = free[1][3]  # some rows stop early, others run to max_new_tokens
    ids, mask = left_pad(prompts, tok.pad_token_id)
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
    )[:, ids.shape[1] :].tolist()
    model.generation_config.eos_token_id = eos
    try:
        got = backend(model, tok, batch_size=8).generate(prompts, seed=0)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    for r, comps in zip(ref, got):
        expected = r[: r.index(eos) + 1] if eos in r else r
        assert comps[0].token_ids == expected
    assert {c[0].finish_reason for c in got} == {"stop", "length"}


def test_topk_logprobs_are_the_teacher_distribution_for_each_completion_token(model, tok):
    k = 6
    prompts = prompts_of(tok)
    for p, comps in zip(prompts, backend(model, tok, topk_logprobs=k).generate(prompts, seed=0)):
        c = comps[0]
        with torch.no_grad():  # teacher forcing, no padding: what distill's online teacher sees
            logits = model(torch.tensor([p + c.token_ids])).logits[0]  # (P+C, V)
        logp = torch.log_softmax(logits[len(p) - 1 : len(p) + len(c.token_ids) - 1], -1)  # (C, V)
        stored_ids = torch.tensor(c.topk_ids)  # (C, k)
        assert stored_ids.shape == (len(c.token_ids), k)
        assert torch.allclose(logp.gather(1, stored_ids), torch.tensor(c.topk_logprobs), atol=1e-4)
        assert torch.allclose(logp.topk(k, -1).values, torch.tensor(c.topk_logprobs), atol=1e-4)
        # greedy: the completion token is the top-1 of its own predicting distribution
        assert stored_ids[:, 0].tolist() == c.token_ids


def test_decode_forms_are_chosen_at_timed_widths_and_cover_every_batch_width(model, monkeypatch):
    """auto times the forms at 1, 2, 4, ... batch_size and each width 1..batch_size takes the
    choice of the widest timed width at or below it; false times nothing; true is W @ x^T."""
    from draftsmith import fast_linear
    from draftsmith.data import hf_backend

    asked = []

    def fake_choice(m, context, widths, repeats):
        asked.append(list(widths))
        return {"forms": {"4": "W@x^T", "12": "packed"}, "ms": {}, "repeats": repeats}

    monkeypatch.setattr(fast_linear, "choose_linear_forms", fake_choice)
    forms = hf_backend.decode_linear_forms(model, DataConfig(batch_size=12), vocab=300)
    assert asked == [[1, 2, 4, 8, 12]]
    assert forms == {4: "W@x^T", 5: "W@x^T", 6: "W@x^T", 7: "W@x^T", 12: "packed"}
    assert hf_backend.decode_linear_forms(model, DataConfig(cpu_few_row_linear=False), 300) == {}
    on = hf_backend.decode_linear_forms(
        model, DataConfig(batch_size=3, cpu_few_row_linear=True), 300
    )
    assert on == {2: "W@x^T", 3: "W@x^T"} and len(asked) == 1


def test_the_decode_forms_timed_once_are_kept_for_a_resumed_generate(model, monkeypatch, tmp_path):
    """The choice is written beside the shards with what it was timed for; a rerun on the same
    machine takes it without timing (a fresh timing could pick otherwise and round the
    resumed shards differently), and a changed batch width or machine times again."""
    from draftsmith import fast_linear, models
    from draftsmith.data import hf_backend

    picks = iter([{"2": "W@x^T"}, {"1": "W@x^T"}, {"4": "W@x^T"}])
    asked = []

    def fake_choice(m, context, widths, repeats):
        asked.append(list(widths))
        return {"forms": next(picks), "ms": {}, "repeats": repeats}

    monkeypatch.setattr(fast_linear, "choose_linear_forms", fake_choice)
    record = tmp_path / "linear_forms.json"

    def forms(batch_size=4):
        dcfg = DataConfig(batch_size=batch_size)
        return hf_backend.decode_linear_forms(model, dcfg, 300, record, target_key="t")

    assert forms() == {2: "W@x^T", 3: "W@x^T"} and len(asked) == 1
    assert json.loads(record.read_text())["forms"] == {"2": "W@x^T"}
    assert forms() == {2: "W@x^T", 3: "W@x^T"} and len(asked) == 1  # kept, not timed again
    assert forms(batch_size=2) == {1: "W@x^T"} and asked[-1] == [1, 2]  # timed again
    monkeypatch.setattr(models, "hardware", lambda: "cpu: another one, 2 threads")
    assert forms(batch_size=2) == {} and len(asked) == 3  # timed again: {"4": ...} is past 2


def test_decode_steps_take_the_chosen_form_and_keep_their_tokens(model, tok, monkeypatch):
    """With W @ x^T at every decode width the backend writes the same completions (greedy)
    and the same teacher log-probs (to float rounding) as with F.linear, and the form is
    really taken: at the batch's widths as its rows finish, never at a prefill's."""
    import draftsmith.fast_linear as fl

    widths = []
    real = fl.few_row_linear

    def spy(x, w, b=None):
        widths.append(x.numel() // w.shape[1])
        return real(x, w, b)

    monkeypatch.setattr(fl, "few_row_linear", spy)
    prompts = prompts_of(tok)
    plain = backend(model, tok, topk_logprobs=5).generate(prompts, seed=0)
    assert widths == []
    dcfg = DataConfig(max_new_tokens=12, batch_size=4, topk_logprobs=5)
    forms = {w: "W@x^T" for w in range(1, 5)}
    few = HFBackend(model, tok, dcfg, linear_forms=forms).generate(prompts, seed=0)
    for a, b in zip(plain, few):
        assert a[0].token_ids == b[0].token_ids
        torch.testing.assert_close(
            torch.tensor(a[0].topk_logprobs), torch.tensor(b[0].topk_logprobs), atol=1e-4, rtol=0
        )
    assert widths and set(widths) <= {2, 3, 4}  # width 1 is padded to 2 rows
    assert not any("forward" in vars(m) for m in model.modules())  # restored after


def test_generation_stops_at_eos_and_padding_never_leaks(model, tok):
    prompts = prompts_of(tok)
    free = [c[0].token_ids for c in backend(model, tok).generate(prompts, seed=0)]
    eos = free[0][2]  # a token the first prompt emits third: it will stop there
    model.generation_config.eos_token_id = eos
    try:
        got = backend(model, tok, topk_logprobs=3).generate(prompts, seed=0)
    finally:
        model.generation_config.eos_token_id = tok.eos_token_id
    for f, comps in zip(free, got):
        c = comps[0]
        expected = f[: f.index(eos) + 1] if eos in f else f
        assert c.token_ids == expected  # EOS kept as the last token, nothing after it
        assert c.finish_reason == ("stop" if eos in f else "length")
        assert len(c.topk_ids) == len(c.token_ids)
    assert any(comps[0].finish_reason == "length" for comps in got)  # some rows were padded


def test_sampling_is_seeded_and_n_samples_per_prompt(model, tok):
    prompts = prompts_of(tok)
    be = backend(model, tok, temperature=1.0, top_p=0.9, top_k=50, n=2, batch_size=4)
    a, b, c = (
        be.generate(prompts, seed=1),
        be.generate(prompts, seed=1),
        be.generate(prompts, seed=2),
    )
    ids = lambda res: [[s.token_ids for s in comps] for comps in res]  # noqa: E731
    assert all(len(comps) == 2 for comps in a)
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert any(comps[0].token_ids != comps[1].token_ids for comps in a)


# ----------------------------------------------------------------------------- the stage


def tiny_cfg(out: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "tiny.yaml", [f"run.output_dir={out}", "run.device=cpu", *overrides]
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("gen") / "run"
    cfg = tiny_cfg(out)
    run_generate(cfg)
    return cfg, out


def test_stage_writes_the_contract(finished):
    cfg, out = finished
    ds = load_train_dataset(out)
    for col in (
        "prompt_ids",
        "completion_ids",
        "prompt_text",
        "completion_text",
        "category",
        "source",
        "split",
        "topk_ids",
        "topk_logprobs",
    ):
        assert col in ds.column_names
    assert set(ds["split"]) == {"train"} and set(ds["source"]) == {"draftsmith", "humaneval"}
    for row in ds:
        assert len(row["topk_ids"]) == len(row["completion_ids"]) <= cfg.data.max_new_tokens
        assert all(len(r) == cfg.data.topk_logprobs for r in row["topk_ids"])
        assert row["prompt_text"].startswith("<|im_start|>user\n")  # chat template applied
    evals = load_eval_prompts(out)
    assert len(evals) == cfg.data.max_eval_prompts
    assert set(evals[0]) == {
        "id",
        "prompt_text",
        "prompt_ids",
        "category",
        "source",
        "eval_set",
        "messages",
        "followups",
    }
    assert {e["eval_set"] for e in evals} == {"heldout"}  # role both only: the held-out split
    assert not {e["prompt_text"] for e in evals} & set(ds["prompt_text"])  # never trained on
    assert len(set(ds["prompt_id"])) == len(ds)
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["num_completions"] == len(ds) == meta["num_prompts"]
    assert meta["num_completion_tokens"] == sum(map(len, ds["completion_ids"]))
    assert meta["num_eval_prompts"] == len(evals) and meta["eval_sets"] == {"heldout": len(evals)}
    assert meta["num_prompts"] + meta["num_eval_prompts"] + meta["num_skipped"] == 50  # tiny.yaml
    assert meta["target"]["fingerprint"].startswith("sha256-quick:")
    assert meta["tokens_per_s"] > 0 and not (out / "data" / "shards").exists()


def test_rerun_of_finished_stage_says_so(finished, capsys):
    cfg, out = finished
    stamp = (out / "data" / "meta.json").stat().st_mtime_ns
    run_generate(cfg)
    said = capsys.readouterr().out
    assert "is complete" in said and "skipping" in said
    assert (out / "data" / "meta.json").stat().st_mtime_ns == stamp


def test_changed_settings_are_refused_not_mixed(finished):
    cfg, out = finished
    cfg2 = tiny_cfg(out, "data.max_new_tokens=8")
    with pytest.raises(DraftsmithError, match="other target/data settings"):
        run_generate(cfg2)


def test_load_helpers_name_the_missing_path(tmp_path):
    with pytest.raises(DraftsmithError, match="run `draftsmith generate CONFIG` first"):
        load_train_dataset(tmp_path)
    with pytest.raises(DraftsmithError, match="eval_prompts.jsonl"):
        load_eval_prompts(tmp_path)


KILL_OVERRIDES = (
    "data.max_train_prompts=8",
    "data.shard_size=2",
    "data.batch_size=1",
    "data.max_new_tokens=32",
    "data.topk_logprobs=4",
)


def kill_after_first_shard(cmd: list[str], out: Path) -> None:
    """Run a generate command and SIGKILL it (with its children) as soon as its first shard
    is on disk: a run killed mid-way, with data/meta.json not yet written."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    first = out / "data" / "shards" / "shard-00000"
    deadline = time.time() + 120
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert first.exists() and not (out / "data" / "meta.json").exists(), "not killed mid-run"


def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, tiny_model_dir):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    cmd = [
        sys.executable,
        "-m",
        "draftsmith.cli",
        "generate",
        "configs/tiny.yaml",
        f"run.output_dir={killed}",
        *KILL_OVERRIDES,
    ]
    kill_after_first_shard(cmd, killed)
    done = len(list((killed / "data" / "shards").glob("shard-?????")))
    assert 1 <= done < 4

    rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"{4 - done} of 4 shards to go" in rerun.stdout
    run_generate(tiny_cfg(clean, *KILL_OVERRIDES))

    a, b = load_train_dataset(killed), load_train_dataset(clean)
    assert Counter(a["prompt_id"]) == Counter(b["prompt_id"]) and len(set(a["prompt_id"])) == 8
    assert a.to_dict() == b.to_dict()  # same shards, same batches: exactly equal


def write_prompts(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


@pytest.mark.parametrize("case", ["missing_file", "empty", "missing_field", "too_long"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, tiny_model_dir, case):
    out = tmp_path / "run"
    cfg = tiny_cfg(out)
    f = tmp_path / "p.jsonl"
    if case == "missing_file":
        match = "prompt file not found"
    elif case == "empty":
        f.write_text("")
        match = "no prompts found"
    elif case == "missing_field":
        f.write_text(json.dumps({"question": "hi"}) + "\n")
        match = "no field 'prompt'"
    else:
        write_prompts(f, [f"prompt number {i} " * (1 + 20 * (i == 3)) for i in range(8)])
        cfg.data.max_prompt_tokens, cfg.data.too_long = 100, "error"
        match = "data.too_long: prompt .* over the limit of 100"
    cfg.data.sources = [PromptSource(path=str(f))]
    with pytest.raises(DraftsmithError, match=match) as e:
        run_generate(cfg)
    assert "\n" not in str(e.value)
    if case != "too_long":
        assert str(f) in str(e.value)
    assert not (out / "data").exists()


def test_too_long_prompts_are_skipped_and_counted(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    cfg = tiny_cfg(out, "data.max_eval_prompts=2", "data.max_new_tokens=4")
    long_ones = {3, 7}
    texts = [f"prompt number {i} " * (1 + 20 * (i in long_ones)) for i in range(12)]
    cfg.data.sources = [PromptSource(path=str(write_prompts(tmp_path / "p.jsonl", texts)))]
    cfg.data.max_prompt_tokens = 100
    run_generate(cfg)
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["num_skipped"] == 2
    kept = list(load_train_dataset(out)["prompt_text"]) + [
        e["prompt_text"] for e in load_eval_prompts(out)
    ]
    assert len(kept) == 10 and not any(texts[i] in t for i in long_ones for t in kept)


@pytest.mark.parametrize(
    "override, key", [("data.n=0", "data.n"), ("data.temperature=-1", "data.temperature")]
)
def test_cli_rejects_bad_sampling_settings_with_exit_2(tmp_path, override, key):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftsmith.cli",
            "generate",
            "configs/tiny.yaml",
            f"run.output_dir={out}",
            override,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0]
    assert not out.exists()


def test_saved_dataset_features_are_compact(finished):
    _, out = finished
    feats = datasets.load_from_disk(str(out / "data" / "dataset")).features
    assert feats["completion_ids"].feature.dtype == "int32"
    assert feats["topk_logprobs"].feature.feature.dtype == "float32"
