"""A run directory you can trust (issue 15): nothing deleted, nothing misreported, every
corrupt file one line naming it and what to do, one command per run dir at a time.

Most tests work on a copy (`cp -a`) of one finished tiny run and call the CLI in-process
(`draftsmith.cli.main`), W&B off; each asserts the exact line a user reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from draftsmith.cli import main
from draftsmith.config import Config, load_config
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.io import atomic_write_text, clean_stale_temps

LOCK_FILE = "draftsmith.lock"

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.yaml")
QUIET = "tracking.wandb.mode=disabled"
REDO_DATA = "and rerun `draftsmith generate CONFIG`"


def ds(*args: str) -> tuple[int, list[str]]:
    """`draftsmith ARGS` in this process: (exit code, stderr lines)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(args))
    return code, err.getvalue().strip().splitlines()


def on(run: Path, command: str, *overrides: str) -> tuple[int, list[str]]:
    return ds(command, TINY, f"run.output_dir={run}", QUIET, *overrides)


def truncate(path: Path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """`cp -a` of the finished run, free to damage."""
    out = tmp_path / "copy"
    shutil.copytree(tiny_run, out, symlinks=True)
    return out


def board_of(run: Path) -> dict:
    return json.loads((run / "eval" / "leaderboard.json").read_text())


# ----------------------------------------------------------------------------- data loss


@pytest.mark.parametrize(
    "where, says",
    [
        ("run", "is the run directory or holds it"),
        ("parent", "is the run directory or holds it"),
        ("data", "lies inside the run's data/"),
        ("checkpoints/checkpoint-6", "lies inside the run's checkpoints/"),
        ("eval", "lies inside the run's eval/"),
        ("ablations/ce", "lies inside the run's ablations/"),
        ("wandb", "lies inside the run's wandb/"),
    ],
)
def test_export_never_targets_the_run_its_parents_or_a_stage_dir(tmp_path, where, says):
    from draftsmith.export import check_export_target

    run = tmp_path / "runs" / "r"
    target = {"run": run, "parent": tmp_path / "runs"}.get(where, run / where)
    cfg = load_config(
        TINY, [f"run.output_dir={run}", f"export.output_dir={target}", "export.overwrite=true"]
    )
    with pytest.raises(ConfigError) as e:
        check_export_target(cfg)
    assert str(e.value).startswith(f"export.output_dir: {target} {says}")


def test_export_over_the_run_dir_deletes_nothing(run_copy):
    """The issue's case: export.output_dir=<the run> with overwrite replaced the whole run."""
    before = sorted(p.relative_to(run_copy) for p in run_copy.rglob("*"))
    code, err = on(run_copy, "export", f"export.output_dir={run_copy}", "export.overwrite=true")
    assert code == 2
    assert err == [
        f"draftsmith: error: export.output_dir: {run_copy} is the run directory or holds it; an "
        "export there would replace the run's data, checkpoints and results. Choose a directory "
        f"outside them (the default is {run_copy / 'export'})"
    ]
    assert sorted(p.relative_to(run_copy) for p in run_copy.rglob("*")) == before


def test_overwrite_replaces_a_previous_export_and_nothing_else(run_copy, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, err = on(run_copy, "export", f"export.output_dir={mine}", "export.overwrite=true")
    assert code == 1
    assert err[-1] == (
        f"draftsmith: error: {mine}: not a draftsmith export (no draftsmith_export.json); "
        "export.overwrite replaces only a previous export. Choose another export.output_dir, or "
        "delete it yourself"
    )
    assert (mine / "notes.txt").read_text() == "keep me"
    # the run's own export (marked by the export that wrote it) is replaced
    assert on(run_copy, "export", "export.checkpoint=checkpoint-3", "export.overwrite=true")[0] == 0
    marker = json.loads((run_copy / "export" / "draftsmith_export.json").read_text())
    assert marker["checkpoint"] == "checkpoint-3"
    assert marker["source"] == "checkpoints/checkpoint-3"


def test_a_refused_command_leaves_config_yaml_as_it_was(run_copy):
    """generate with another temperature on a finished run: refused, config.yaml untouched,
    and the run still reruns from its config."""
    before = (run_copy / "config.yaml").read_bytes()
    code, err = on(run_copy, "generate", "data.temperature=0.7")
    assert code == 1
    assert err == [
        f"draftsmith: error: {run_copy / 'data'}: holds data generated with other target/data "
        "settings (data.temperature differ); delete it or use a new run.output_dir"
    ]
    assert (run_copy / "config.yaml").read_bytes() == before
    shutil.rmtree(run_copy / "export")  # made for the original's location (see below)
    code, err = ds("run", str(run_copy / "config.yaml"), f"run.output_dir={run_copy}")
    assert code == 0, err[-5:]


def test_distill_with_other_training_settings_is_one_error_naming_the_keys(run_copy):
    before = (run_copy / "config.yaml").read_bytes()
    changed = ("distill.loss=reverse_kl", "distill.lr=0.05", "draft.num_layers=3")
    want = (
        f"draftsmith: error: {run_copy / 'checkpoints'}: its checkpoints were trained with other "
        "settings (distill.loss, distill.lr, draft.num_layers differ; e.g. distill.loss was "
        "'forward_kl', now 'reverse_kl'); put the settings back, or delete that dir (or use a "
        "new run.output_dir) to train with these"
    )
    assert on(run_copy, "distill", *changed) == (1, [want])
    # `run` refuses before generate or anything else runs
    assert on(run_copy, "run", *changed) == (1, [want])
    assert (run_copy / "config.yaml").read_bytes() == before


def test_card_and_leaderboard_state_the_checkpoints_own_training(run_copy, tmp_path):
    """Trained as configs/tiny.yaml says (1 layer, forward_kl, lr 1e-3); exported under a
    config that now says otherwise: the card states what the checkpoint records."""
    from draftsmith.distill.checkpoint import read_meta

    out = tmp_path / "exported"
    code, _ = on(
        run_copy,
        "export",
        "distill.loss=reverse_kl",
        "distill.lr=0.05",
        "draft.num_layers=3",
        "export.checkpoint=checkpoint-6",
        f"export.output_dir={out}",
    )
    assert code == 0
    card = (out / "README.md").read_text()
    assert "- initialisation: from_target layers [0]\n" in card
    assert (
        "- training: forward_kl (teacher: online, temperature 1.0), 6 steps, batch 4 x 1 "
        "accumulation, lr 0.001\n"
    ) in card
    rows = {r["checkpoint"]: r for r in board_of(run_copy)["rows"]}
    meta = read_meta(run_copy / "checkpoints" / "checkpoint-6")
    assert rows["checkpoint-6"]["trained_with"] == {"init": meta["init"], **meta["settings"]}
    assert meta["settings"]["distill"]["lr"] == 0.001
    assert meta["settings"]["draft"]["num_layers"] == 1


def test_a_moved_or_copied_run_exports_its_own_weights(tiny_run, tmp_path):
    board = board_of(tiny_run)
    assert board["best_path"] == f"checkpoints/{board['best']}"
    assert [r["path"] for r in board["rows"]] == [
        f"checkpoints/{r['checkpoint']}" for r in board["rows"]
    ]
    moved = tmp_path / "moved"
    shutil.copytree(tiny_run, tmp_path / "a", symlinks=True)
    (tmp_path / "a").rename(moved)  # mv
    shutil.rmtree(moved / "export")
    copy = tmp_path / "copy"
    shutil.copytree(moved, copy, symlinks=True)  # cp -a
    truncate(moved / board["best_path"] / "model.safetensors", 1000)  # the copy must not read it
    assert on(copy, "export")[0] == 0
    got = (copy / "export" / "model.safetensors").read_bytes()
    assert got == (copy / board["best_path"] / "model.safetensors").read_bytes()
    spec = json.loads((copy / "export" / "speculative_config.json").read_text())
    assert spec["model"] == str((copy / "export").resolve())


def test_an_export_copied_with_its_run_is_redone_not_trusted(run_copy, tiny_run):
    code, err = on(run_copy, "export")
    assert code == 1
    assert err == [
        f"draftsmith: error: {run_copy / 'export'}: export dir exists (made at "
        f"{(tiny_run / 'export').resolve()}; moved or copied since); set export.overwrite=true "
        "to replace it"
    ]
    assert on(run_copy, "export", "export.overwrite=true")[0] == 0
    spec = json.loads((run_copy / "export" / "speculative_config.json").read_text())
    assert spec["model"] == str((run_copy / "export").resolve())


# ----------------------------------------------------------------------------- corrupt files


def _redo_ckpt(path: Path) -> str:
    return (
        f"delete {path} and rerun `draftsmith distill CONFIG` (it resumes from the newest "
        "complete checkpoint)"
    )


def test_truncated_meta_json(run_copy):
    truncate(run_copy / "data" / "meta.json", 40)
    assert on(run_copy, "generate") == (
        1,
        [
            f"draftsmith: error: {run_copy / 'data' / 'meta.json'}: truncated or not JSON "
            f"(Unterminated string starting at, line 3); delete {run_copy / 'data'} {REDO_DATA}"
        ],
    )


def test_an_eval_prompt_without_its_eval_set_is_one_line(run_copy):
    path = run_copy / "data" / "eval_prompts.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    del record["eval_set"]
    path.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
    assert on(run_copy, "evaluate") == (
        1,
        [
            f"draftsmith: error: {path}: line 2 has no 'eval_set'; delete {run_copy / 'data'} {REDO_DATA}"
        ],
    )


def test_truncated_eval_prompts(run_copy):
    path = run_copy / "data" / "eval_prompts.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:30])
    assert on(run_copy, "evaluate") == (
        1,
        [
            f"draftsmith: error: {path}: line 3 is truncated or not JSON (Unterminated string "
            f"starting at); delete {run_copy / 'data'} {REDO_DATA}"
        ],
    )


def test_truncated_leaderboard(run_copy, tmp_path):
    path = run_copy / "eval" / "leaderboard.json"
    truncate(path, 100)
    code, err = on(run_copy, "export", f"export.output_dir={tmp_path / 'x'}")
    assert code == 1
    assert err[-1].startswith(f"draftsmith: error: {path}: truncated or not JSON (")
    assert err[-1].endswith(
        "; delete it and rerun `draftsmith evaluate CONFIG` (finished results are cached)"
    )
    assert not (tmp_path / "x").exists()


def test_truncated_dataset_arrow_file(run_copy):
    shutil.rmtree(run_copy / "checkpoints")  # so distill has to read the data
    (arrow,) = (run_copy / "data" / "dataset").glob("*.arrow")
    truncate(arrow, arrow.stat().st_size // 2)
    code, err = on(run_copy, "distill")
    assert code == 1
    assert err[-1].startswith(f"draftsmith: error: {run_copy / 'data' / 'dataset'}: unreadable (")
    assert err[-1].endswith(f"); delete {run_copy / 'data'} {REDO_DATA}")
    assert "Traceback" not in "\n".join(err)


def test_generate_does_not_call_a_truncated_dataset_complete(run_copy):
    (arrow,) = (run_copy / "data" / "dataset").glob("*.arrow")
    truncate(arrow, arrow.stat().st_size // 2)
    code, err = on(run_copy, "generate")
    assert code == 1
    assert err[-1].startswith(f"draftsmith: error: {run_copy / 'data' / 'dataset'}: unreadable (")
    assert err[-1].endswith(f"); delete {run_copy / 'data'} {REDO_DATA}")


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "evaluate.k_sweep=[]",
            "evaluate.k_sweep: empty; list at least one number of draft tokens per round "
            "(e.g. [1, 2, 4])",
        ),
        (
            "distill.warmup_steps=7",  # tiny.yaml: max_steps 6
            "distill.warmup_steps: 7 is over distill.max_steps (6), so the learning rate would "
            "never reach distill.lr",
        ),
        (
            "data.max_new_tokens=1e11",
            "data.max_new_tokens: expected an integer, got 100000000000.0",
        ),
    ],
)
def test_config_errors_found_late_before_are_exit_2_before_anything_is_written(
    tmp_path, override, line
):
    out = tmp_path / "run"
    code, err = ds("run", TINY, f"run.output_dir={out}", QUIET, override)
    assert (code, err) == (2, [f"draftsmith: error: {line}"])
    assert not out.exists()


def test_pretrained_draft_of_another_tokenizer_fails_before_generate(tmp_path, tiny_model_dir):
    from test_models import _shuffled_byte_tokenizer

    draft = tmp_path / "other-draft"
    shutil.copytree(tiny_model_dir, draft)
    for f in draft.glob("tokenizer*"):
        f.unlink()
    _shuffled_byte_tokenizer().save_pretrained(draft)
    out = tmp_path / "run"
    code, err = ds(
        "run", TINY, f"run.output_dir={out}", QUIET, "draft.init=pretrained", f"draft.model={draft}"
    )
    assert code == 1
    assert err[-1].startswith("draftsmith: error: tokenizer mismatch between target ")
    assert f"and draft {draft}: token 'a' has id " in err[-1]
    assert not out.exists()  # generate never ran: no data/, no config.yaml


# ----------------------------------------------------------------------------- a full disk


def test_full_disk_errors_name_the_file_whatever_the_library_raised(monkeypatch, tmp_path):
    import errno

    from draftsmith import io as dio

    target = tmp_path / "checkpoint-3"
    # torch.save's zip writer: a RuntimeError with no errno, a full disk only if it is full
    zip_error = RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
    monkeypatch.setattr(dio, "_free_bytes", lambda path: 1 << 10)
    with pytest.raises(OSError) as e, dio.named_write_errors(target):
        raise zip_error
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(target))
    monkeypatch.setattr(dio, "_free_bytes", lambda path: 1 << 40)
    with pytest.raises(RuntimeError), dio.named_write_errors(target):
        raise zip_error  # plenty of room: some other failure, left as it is
    # safetensors' Rust error, and a bare OSError without a filename (file.write, savefig)
    with pytest.raises(OSError) as e, dio.named_write_errors(target):
        raise Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(target))
    with pytest.raises(OSError) as e, dio.named_write_errors(target):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(e.value) == f"[Errno {errno.ENOSPC}] No space left on device: '{target}'"


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_leaves_no_temp(monkeypatch, tmp_path):
    from draftsmith import io as dio
    from draftsmith.distill import checkpoint

    def full_disk_save(obj, f, *a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk_save)
    monkeypatch.setattr(dio, "_free_bytes", lambda path: 0)
    with pytest.raises(OSError) as e:
        checkpoint.save_checkpoint(tmp_path, 3, lambda d: (d / "model").write_text("m"), {}, {})
    assert e.value.filename == str(tmp_path / "checkpoint-3")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1.2 MB tmpfs (root with mount rights only: the unit tests above cover the rest)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_run_on_a_full_disk_says_no_space_in_one_line(small_tmpfs):
    out = small_tmpfs / "run"
    code, err = ds("run", TINY, f"run.output_dir={out}", QUIET)
    (line,) = [e for e in err if e.startswith("draftsmith: error:")]  # beside progress bars
    assert code == 1 and "Traceback" not in "\n".join(err)
    assert line.startswith(f"draftsmith: error: {out}/")
    assert line.endswith(": No space left on device")
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]


def test_truncated_train_state(run_copy):
    shutil.rmtree(run_copy / "checkpoints" / "checkpoint-6")  # distill resumes from 3
    ckpt = run_copy / "checkpoints" / "checkpoint-3"
    truncate(ckpt / "train_state.pt", 3000)
    code, err = on(run_copy, "distill")
    assert code == 1
    assert err[-1].startswith(
        f"draftsmith: error: {ckpt / 'train_state.pt'}: truncated or corrupt ("
    )
    assert err[-1].endswith(_redo_ckpt(ckpt))


@pytest.mark.parametrize("stage, step", [("distill", 6), ("evaluate", 3)])
def test_truncated_checkpoint_weights(run_copy, stage, step):
    ckpt = run_copy / "checkpoints" / f"checkpoint-{step}"
    weights = ckpt / "model.safetensors"
    size = weights.stat().st_size
    truncate(weights, size - 100)
    code, err = on(run_copy, stage)
    assert code == 1
    assert err[-1] == (
        f"draftsmith: error: {weights}: {size - 100} bytes where the header promises {size}: "
        f"truncated; {_redo_ckpt(ckpt)}"
    )


@pytest.mark.parametrize("stage", ["evaluate", "export"])
def test_missing_checkpoint_record(run_copy, tmp_path, stage):
    ckpt = run_copy / "checkpoints" / board_of(run_copy)["best"]
    (ckpt / "draftsmith_checkpoint.json").unlink()
    code, err = on(run_copy, stage, f"export.output_dir={tmp_path / 'x'}")
    assert code == 1
    assert err[-1] == (
        f"draftsmith: error: {ckpt / 'draftsmith_checkpoint.json'}: missing; {_redo_ckpt(ckpt)}"
    )


@pytest.mark.parametrize("stage", ["evaluate", "export"])
def test_a_checkpoint_record_without_its_settings_is_one_line(run_copy, tmp_path, stage):
    """Every record distill writes holds its settings: one without them is not read as
    "settings not recorded", it is named as the damaged file it is."""
    ckpt = run_copy / "checkpoints" / board_of(run_copy)["best"]
    record = ckpt / "draftsmith_checkpoint.json"
    record.write_text(
        json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "settings"})
    )
    code, err = on(run_copy, stage, f"export.output_dir={tmp_path / 'x'}")
    assert code == 1
    assert err[-1] == (
        f"draftsmith: error: {record}: a checkpoint record without 'settings'; {_redo_ckpt(ckpt)}"
    )


def test_export_never_ships_truncated_weights(run_copy, tmp_path):
    ckpt = run_copy / "checkpoints" / board_of(run_copy)["best"]
    truncate(ckpt / "model.safetensors", 1000)
    code, err = on(run_copy, "export", f"export.output_dir={tmp_path / 'x'}")
    assert code == 1
    assert err[-1].startswith(f"draftsmith: error: {ckpt / 'model.safetensors'}: header of ")
    assert err[-1].endswith(
        f"in a 1000-byte file: truncated or not safetensors; {_redo_ckpt(ckpt)}"
    )
    assert not (tmp_path / "x").exists()


def _tiny_model(tmp_path: Path) -> Path:
    from transformers import LlamaForCausalLM

    from draftsmith.models import tiny_llama_config

    torch.manual_seed(0)
    path = tmp_path / "model"
    LlamaForCausalLM(tiny_llama_config(50, num_hidden_layers=1)).save_pretrained(path)
    return path


def test_weight_checks_find_truncation_missing_and_misshapen_tensors(tmp_path):
    from draftsmith.integrity import check_model_shapes, safetensors_header

    path = _tiny_model(tmp_path)
    weights = path / "model.safetensors"
    check_model_shapes(path, fix="fix it")  # whole: passes (the tied head is stored once)
    tensors = load_file(weights)
    full = weights.read_bytes()
    for keep in (0, 7, 8, 100, len(full) // 2, len(full) - 1):
        weights.write_bytes(full[:keep])
        with pytest.raises(ValueError):
            safetensors_header(weights)
    name = "model.layers.0.mlp.down_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, weights)
    with pytest.raises(DraftsmithError, match=f"{path}: missing tensor {name}; fix it"):
        check_model_shapes(path, fix="fix it")
    save_file({**tensors, name: torch.zeros(3, 3)}, weights)
    with pytest.raises(
        DraftsmithError,
        match=r"down_proj.weight has shape \[3, 3\], config.json builds \[64, 128\]",
    ):
        check_model_shapes(path, fix="fix it")


def test_a_damaged_shard_is_generated_again(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A killed generate leaves finished shards; one is truncated since: the rerun regenerates
    it (its sha256 no longer matches shard.json) and the data equal a clean run's."""
    from draftsmith.data import generate as data_stage
    from draftsmith.data import load_train_dataset, shards

    small = ["data.max_train_prompts=6", "data.shard_size=2", "data.max_new_tokens=6", QUIET]
    out, clean = tmp_path / "run", tmp_path / "clean"

    def killed(*a, **k):
        raise KeyboardInterrupt  # stands in for a kill after the shards, before the dataset

    with monkeypatch.context() as m:
        m.setattr(data_stage, "finish", killed)
        with pytest.raises(KeyboardInterrupt):
            data_stage.run_generate(load_config(TINY, [f"run.output_dir={out}", *small]))
    (arrow,) = (shards.shard_path(out / "data", 1) / "dataset").glob("*.arrow")
    truncate(arrow, arrow.stat().st_size - 50)
    record = shards.shard_path(out / "data", 0) / "shard.json"  # no digests to check it by
    record.write_text(
        json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "files"})
    )
    capsys.readouterr()
    data_stage.run_generate(load_config(TINY, [f"run.output_dir={out}", *small]))
    said = capsys.readouterr().out
    assert "shard-00000 is damaged (shard.json holds no sha256 of its files" in said
    assert "shard-00001 is damaged (its files differ from the sha256 in shard.json" in said
    assert "2 of 3 shards to go" in said
    data_stage.run_generate(load_config(TINY, [f"run.output_dir={clean}", *small]))
    assert load_train_dataset(out).to_dict() == load_train_dataset(clean).to_dict()


@pytest.mark.parametrize("kind", ["not_utf8", "not_gzip", "cut_gzip"])
def test_bad_prompt_files_are_one_line_and_create_nothing(tmp_path, kind):
    import gzip

    if kind == "not_utf8":
        f = tmp_path / "p.jsonl"
        f.write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
        says = f"{f}: not UTF-8 text (byte 15); convert it to UTF-8 (e.g. iconv -t UTF-8)"
    elif kind == "not_gzip":
        f = tmp_path / "p.jsonl.gz"
        f.write_text('{"prompt": "hi"}\n')
        says = f"{f}: not a complete gzip file (Not a gzipped file (b'{{\"'))"
    else:
        f = tmp_path / "p.jsonl.gz"
        f.write_bytes(gzip.compress(b'{"prompt": "hi"}\n' * 50)[:-10])
        says = f"{f}: not a complete gzip file (Compressed file ended before the end-of-stream marker was reached)"
    if kind != "not_utf8":
        says += "; gzip it again, or drop the .gz suffix if it is plain text"
    out = tmp_path / "new" / "run"
    code, err = on(out, "generate", f"data.sources=[{{path: {f}}}]")
    assert (code, err) == (1, [f"draftsmith: error: {says}"])
    assert not (tmp_path / "new").exists()


def _writable(directory: Path) -> bool:
    try:
        (directory / LOCK_FILE).touch()
    except OSError:
        return False
    (directory / LOCK_FILE).unlink()
    return True


@pytest.mark.parametrize("where", ["proc", "under_file", "is_file", "read_only"])
def test_an_output_dir_that_cannot_be_made_or_written(tmp_path, where):
    (tmp_path / "f").write_text("a file")
    out, says = {
        "proc": (Path("/proc/draftsmith-test/run"), "cannot create {} (No such file or directory)"),
        "under_file": (tmp_path / "f" / "run", "cannot create {} (Not a directory)"),
        "is_file": (tmp_path / "f", "{} exists and is not a directory"),
        "read_only": (Path("/sys"), "cannot write in {} (Permission denied)"),
    }[where]
    if where == "read_only" and _writable(out):
        pytest.skip(f"{out} is writable here")
    tail = "" if where == "is_file" else "; choose a writable directory"
    assert on(out, "generate") == (
        1,
        [f"draftsmith: error: run.output_dir: {says.format(out)}{tail}"],
    )


# ----------------------------------------------------------------------------- concurrency


def test_a_second_command_on_a_locked_run_names_the_holder(tmp_path):
    from draftsmith.lock import run_lock

    out = tmp_path / "run"
    out.mkdir()
    with run_lock(out):
        code, err = on(out, "generate")
    assert code == 1
    assert len(err) == 1 and err[0].startswith(
        f"draftsmith: error: {out}: in use by draftsmith pid {os.getpid()} ("
    )
    assert err[0].endswith("); wait for it to finish (or stop it), or use another run.output_dir")
    with run_lock(out):  # released when the holder is done
        pass


def test_the_lock_dies_with_its_process(tmp_path):
    from draftsmith.lock import run_lock

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from draftsmith.lock import run_lock\n"
            f"with run_lock({str(out)!r}):\n    print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with (
        pytest.raises(DraftsmithError, match=f"in use by draftsmith pid {holder.pid} "),
        run_lock(out),
    ):
        pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with run_lock(out):  # no stale lock to clean up
        assert (out / LOCK_FILE).read_text().split("\n")[0] == str(os.getpid())


def test_stale_temps_of_dead_processes_go_live_ones_stay(tmp_path):
    dead, live = dead_pid(), os.getpid()
    names = [
        f"export.tmp-{dead}",
        f"export.tmp-old-{dead}",
        f"leaderboard.json.tmp-{dead}-abc123",
        "plot.png.tmp-plot.png",  # an old name without a pid
        f"export.tmp-{live}",
        f"leaderboard.json.tmp-{live}-xyz",
        "export",
    ]
    for n in names:
        (tmp_path / n).mkdir()
    clean_stale_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[4:])
    atomic_write_text(tmp_path / "a.txt", "x")  # its own temp name carries the pid
    assert (tmp_path / "a.txt").read_text() == "x"


def test_leftovers_of_killed_commands_are_removed_by_the_next(run_copy, tmp_path):
    """kill -9 during export left exp.tmp-<pid>/ (and during generate's finish a dataset
    temp, during a config write a config.yaml temp): the next command removes them."""
    dead = dead_pid()
    leftovers = [
        tmp_path / f"exp.tmp-{dead}",
        run_copy / "data" / f"dataset.tmp-{dead}",
        run_copy / f"config.yaml.tmp-{dead}-k2j4",
    ]
    for d in leftovers:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    assert on(run_copy, "export", f"export.output_dir={tmp_path / 'exp'}")[0] == 0
    assert [d for d in leftovers if d.exists()] == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("exp")) == ["exp"]


# ----------------------------------------------------------------------------- small things


def test_empty_yaml_is_an_error_and_an_empty_mapping_runs_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    with pytest.raises(ConfigError) as e:
        load_config(empty)
    assert str(e.value) == (
        f"{empty}: the config is empty; write the settings to change (e.g. `run: {{output_dir: "
        "runs/mine}`), or `{}` to run every default"
    )
    (tmp_path / "defaults.yaml").write_text("{}\n")
    assert load_config(tmp_path / "defaults.yaml") == Config()


def _float_keys(cls, prefix: str = "") -> list[str]:
    """Every float field of the config schema, as an override key; a list of floats as `key[0]`."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            keys += _float_keys(tp, key + ".")
        elif typing.get_origin(tp) is list and typing.get_args(tp) == (float,):
            keys.append(key + "[0]")
        elif tp is float or float in typing.get_args(tp):
            keys.append(key)
    return keys


def test_non_finite_floats_are_refused_for_every_float_key():
    keys = _float_keys(Config)
    assert "distill.lr" in keys and "data.vllm.gpu_memory_utilization" in keys
    assert "evaluate.stop_thresholds[0]" in keys
    for key in keys:
        for value in (".inf", "-.inf", ".nan"):
            name, listed = key.removesuffix("[0]"), key.endswith("[0]")
            override = f"{name}=[{value}]" if listed else f"{key}={value}"
            with pytest.raises(ConfigError) as e:
                load_config(TINY, [override])
            assert str(e.value) == f"{key}: expected a finite number, got {yaml.safe_load(value)!r}"


def test_empty_stages_is_an_error():
    with pytest.raises(
        ConfigError, match=r"^run.stages: empty, so `draftsmith run` would do nothing"
    ):
        load_config(TINY, ["run.stages=[]"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_fails_before_anything_is_written(tmp_path):
    out = tmp_path / "new" / "run"
    assert on(out, "run", "run.device=cuda") == (
        1,
        ["draftsmith: error: run.device: 'cuda' was asked for but no CUDA device is available"],
    )
    assert not (tmp_path / "new").exists()


def test_a_baseline_with_another_tokenizer_is_named_before_any_decoding(run_copy, tmp_path):
    from transformers import AutoTokenizer

    from draftsmith.models import registry_path

    other = tmp_path / "other-tok"
    shutil.copytree(registry_path("tiny-random-llama"), other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    shutil.rmtree(run_copy / "eval")  # nothing cached: every draft would be decoded
    code, err = on(run_copy, "evaluate", f"evaluate.baselines=[{other}]")
    assert code == 1
    assert err[-1].startswith(
        "draftsmith: error: tokenizer mismatch between target tiny-random-llama and draft "
        f"evaluate.baselines[0] ({other}): token '<extra>' has no id in the target and id "
    )
    assert not list((run_copy / "eval").rglob("*.json"))  # nothing was decoded


def test_reliability_readme_lists_every_bad_input():
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Reliability") :]
    for needle in (
        "not UTF-8",
        "not gzip",
        "cannot be created or written",
        "model.safetensors",
        "data shard",
        "meta.json",
        "eval_prompts.jsonl",
        "leaderboard.json",
        "train_state.pt",
        "draftsmith_checkpoint.json",
        "draftsmith.lock",
        "empty config",
    ):
        assert needle in section, needle
