"""Config validation: every user mistake is one line naming the key, exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.config import Config, load_config, parse_override
from draftsmith.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_are_a_valid_config(tmp_path):
    cfg = load_config(write(tmp_path, "{}\n"))  # an empty file is an error (test_reliability)
    assert cfg == Config()
    assert cfg.distill.loss == "forward_kl"


SHIPPED = sorted(str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load_and_name_their_command(name):
    path = REPO / "configs" / name
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(f"draftsmith run configs/{name}" in line for line in header)


def test_overrides_are_coerced_to_field_types(tmp_path):
    cfg = load_config(
        write(tmp_path, "distill:\n  lr: 1.0e-3\n"),
        [
            "distill.lr=3e-4",
            "evaluate.k_sweep=[2,4,6]",
            "distill.max_steps=7",
            "data.chat_template=false",
            "run.output_dir=/tmp/x",
            "distill.warmup_steps=0",
        ],
    )
    assert cfg.distill.lr == pytest.approx(3e-4)
    assert cfg.evaluate.k_sweep == [2, 4, 6]
    assert cfg.distill.max_steps == 7
    assert cfg.data.chat_template is False
    assert cfg.run.output_dir == "/tmp/x"


def test_int_is_accepted_for_float_field(tmp_path):
    cfg = load_config(write(tmp_path, "distill:\n  temperature: 2\n"))
    assert cfg.distill.temperature == 2.0 and isinstance(cfg.distill.temperature, float)


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    assert load_config(write(tmp_path, "distill:\n  lr: 3e-4\n")).distill.lr == pytest.approx(3e-4)


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("distill:\n  lr: [1\n", [], "line 3"),  # malformed YAML, reported with its line
        ("distill:\n  lrr: 0.1\n", [], "distill.lrr: unknown key (did you mean distill.lr?)"),
        ("distil:\n  lr: 0.1\n", [], "distil: unknown key (did you mean distill?)"),
        ("distill:\n  max_steps: ten\n", [], "distill.max_steps: expected an integer"),
        ("distill:\n  max_steps: 0\n", [], "distill.max_steps: must be >= 1"),
        ("data:\n  temperature: -1\n", [], "data.temperature: must be >= 0"),
        ("data:\n  n: 0\n", [], "data.n: must be >= 1"),
        ("distill:\n  loss: kl\n", [], "distill.loss: expected one of"),
        ("distill:\n  beta: 1.0\n", [], "distill.beta: must be < 1"),
        ("{}", ["distill.lr=abc"], "distill.lr: expected a number"),
        ("{}", ["evaluate.k_sweep=[0,4]"], "evaluate.k_sweep[0]: must be between 1 and 32"),
        (
            "{}",
            ["evaluate.stop_thresholds=[0.5,1.0]"],
            "evaluate.stop_thresholds[1]: a probability strictly between 0 and 1, got 1.0",
        ),
        ("{}", ["evaluate.stop_thresholds=[0]"], "evaluate.stop_thresholds[0]: a probability"),
        (
            "{}",
            ["evaluate.second_choice_min=[0.1,1]"],
            "evaluate.second_choice_min[1]: a probability in [0, 1), got 1",
        ),
        (
            "{}",
            ["evaluate.second_choice_min=[0.1]", "evaluate.backend=vllm"],
            "evaluate.second_choice_min: second-choice leaves are the native engine's",
        ),
        ("{}", ["distill.train_layers=0"], "distill.train_layers: must be >= 1"),
        ("{}", ["evaluate.cpu_few_row_linear=maybe"], "evaluate.cpu_few_row_linear: expected"),
        (
            "{}",
            ["distill.max_steps=10", "distill.save_steps=[4,11]"],
            "distill.save_steps[1]: must be between 1 and distill.max_steps (10), got 11",
        ),
        ("{}", ["distill.nope=1"], "distill.nope: unknown key"),
        ("{}", ["distill"], "an override must look like key=value"),
        ("draft:\n  init: pretrained\n", [], "draft.model: required"),
        ("distill:\n  teacher: offline\n", [], "data.topk_logprobs: must be > 0"),
        ("data:\n  sources: [{builtin: x, path: y}]\n", [], "data.sources[0]: give exactly one"),
        (
            "data:\n  sources: [{bultin: x}]\n",
            [],
            "data.sources[0].bultin: unknown key (did you mean",
        ),
        ("- a\n- b\n", [], "top level must be a mapping"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path, text, overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), overrides)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_parse_override_reads_yaml_values():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=hello world") == (["a"], "hello world")


@pytest.mark.parametrize(
    "text, args, expected",
    [
        ("distill:\n  lr: [1\n", [], "malformed YAML"),
        ("distill:\n  lrr: 1\n", [], "did you mean distill.lr?"),
        ("", ["distill.max_steps=-3"], "distill.max_steps: must be >= 1"),
    ],
)
def test_cli_bad_config_exits_2_with_one_line_and_no_traceback(tmp_path, text, args, expected):
    path = write(tmp_path, f"run:\n  output_dir: {tmp_path / 'out'}\n{text}")
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "distill", str(path), *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written for a config that never validated


def test_cli_missing_config_file_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "generate", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "config file not found" in proc.stderr


def test_debug_flag_shows_traceback(tmp_path):
    path = write(tmp_path, "distill:\n  lrr: 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "distill", str(path), "--debug"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" in proc.stderr
