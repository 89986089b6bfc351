"""The CLI: every command has help saying what it does and where it writes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from draftsmith.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", *args], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "command, writes",
    [
        ("generate", "<output_dir>/data/"),
        ("distill", "<output_dir>/checkpoints/checkpoint-<step>/"),
        ("evaluate", "<output_dir>/eval/leaderboard"),
        ("export", "<output_dir>/export/"),
        ("run", "<output_dir>/"),
    ],
)
def test_stage_help_says_what_and_where(command, writes, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert writes in out
    assert "key=value" in out


def test_models_help_and_list(capsys):
    with pytest.raises(SystemExit):
        main(["models", "pull", "--help"])
    assert "$DRAFTSMITH_HOME" in " ".join(capsys.readouterr().out.split())
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "tiny-random-llama" in out


def test_unknown_registry_model_is_one_line_exit_1():
    proc = run_cli("models", "pull", "no-such-model")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "draftsmith: error: no-such-model: not a registry model (known: smollm2-135m-instruct, "
        "qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct, tiny-random-llama)"
    ]


def test_resolved_config_is_written_by_a_stage_that_passed_its_checks(
    tmp_path, tiny_config_path, monkeypatch
):
    """config.yaml comes from the stage (rundir.record_config, after its checks), with the
    overrides applied; a command that fails first leaves config.yaml, and a run dir it
    would have created, as they were."""
    import draftsmith.cli as cli
    from draftsmith import pipeline
    from draftsmith.config import load_config
    from draftsmith.errors import DraftsmithError
    from draftsmith.rundir import record_config

    seen = {}

    def stage(cfg):
        seen["cfg"] = cfg
        record_config(cfg)

    def failing(cfg):
        raise DraftsmithError("the stage's own check failed")

    monkeypatch.setattr(pipeline, "stage_function", lambda name: stage)
    out = tmp_path / "run"
    args = ["distill", str(tiny_config_path), f"run.output_dir={out}"]
    assert cli.main([*args, "distill.lr=0.25"]) == 0
    saved = load_config(out / "config.yaml")
    assert saved.distill.lr == 0.25 and saved == seen["cfg"]

    monkeypatch.setattr(pipeline, "stage_function", lambda name: failing)
    assert cli.main([*args, "distill.lr=0.5"]) == 1
    assert load_config(out / "config.yaml").distill.lr == 0.25
    fresh = tmp_path / "new" / "run"
    assert cli.main(["distill", str(tiny_config_path), f"run.output_dir={fresh}"]) == 1
    assert not (tmp_path / "new").exists()


def test_a_moved_runs_config_says_which_run_dir_it_works_on(tmp_path, monkeypatch, capsys):
    """`mv run moved` then `draftsmith run moved/config.yaml`: the file still names the old
    directory; the command says so instead of silently working there."""
    import draftsmith.cli as cli
    from draftsmith import pipeline
    from draftsmith.config import dump_config, load_config

    old, moved = tmp_path / "run", tmp_path / "moved"
    moved.mkdir()
    (moved / "draftsmith.lock").write_text("")
    (moved / "config.yaml").write_text(
        dump_config(load_config("configs/tiny.yaml", [f"run.output_dir={old}"]))
    )
    monkeypatch.setattr(pipeline, "stage_function", lambda name: lambda cfg: None)
    monkeypatch.setattr(pipeline, "preflight", lambda cfg, stages: None)
    assert cli.main(["evaluate", str(moved / "config.yaml")]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"draftsmith: note: {moved / 'config.yaml'} names run.output_dir {old}, not the run "
        f"directory it is in; working on {old} (add run.output_dir={moved} to work on this one)"
    ]
    assert cli.main(["evaluate", str(moved / "config.yaml"), f"run.output_dir={moved}"]) == 0
    assert capsys.readouterr().err == ""
