"""scripts/gpu_check.sh on a CPU: valid bash, and its dry run prints exactly the commands a
GPU machine would run, each under its own timeout, within the 8-minute budget."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.config import load_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
E2E_OVERRIDES = [
    "run.device=cuda",
    "data.backend=vllm",
    "evaluate.backend=vllm",
    "evaluate.on_mismatch=warn",
    "evaluate.k_sweep=[3]",
    "distill.save_every=6",
    "tracking.wandb.mode=disabled",
    "data.vllm.gpu_memory_utilization=0.3",
    "evaluate.vllm.gpu_memory_utilization=0.3",
]


def dry_run(tmp_path: Path, home: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GPU_CHECK_DRY_RUN": "1",
        "GPU_CHECK_PYTHON": "python3",
        "GPU_CHECK_OUT": str(tmp_path / "out"),
        "DRAFTSMITH_HOME": str(home),
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path, env=env
    )


def planned(stdout: str) -> list[tuple[str, int, list[str]]]:
    """(step, timeout seconds, argv) of every DRY-RUN line."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("DRY-RUN "):
            head, _, cmd = line[len("DRY-RUN ") :].partition(": ")
            name, limit = head.split()
            out.append((name, int(limit.rstrip("s")), shlex.split(cmd)))
    return out


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_script_passes_shellcheck():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    proc = dry_run(tmp_path, tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    steps = planned(proc.stdout)
    out = str(tmp_path / "out")
    bench = ["python3", "scripts/bench_specdec.py", "--device", "cuda"]
    assert [(name, argv) for name, _, argv in steps] == [
        (
            "install",
            ["python3", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."],
        ),
        ("cuda", ["python3", "-c", steps[1][2][2]]),
        (
            "pytest-gpu",
            ["python3", "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
        ),
        ("bench-k1", [*bench, "--target", "tiny-random-llama", "--k", "1"]),
        ("bench-k4", [*bench, "--target", "tiny-random-llama", "--k", "4"]),
        (
            "vllm-e2e",
            [
                "python3",
                "-m",
                "draftsmith.cli",
                "run",
                "configs/tiny.yaml",
                f"run.output_dir={out}/e2e",
            ]
            + E2E_OVERRIDES,
        ),
    ]
    assert "torch.cuda.is_available()" in steps[1][2][2]
    assert [limit for _, limit, _ in steps] == [30, 15, 100, 60, 60, 200]
    assert sum(limit for _, limit, _ in steps) <= 8 * 60
    summary = proc.stdout.split("==== gpu_check summary")[1].splitlines()[1:-2]
    assert [line.split()[:2] for line in summary] == [[name, "dry-run"] for name, _, _ in steps]
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_dry_run_benchmarks_smollm2_when_it_is_pulled(tmp_path):
    home = tmp_path / "home"
    (home / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    (home / "models" / "smollm2-135m-instruct" / "config.json").write_text("{}")
    steps = planned(dry_run(tmp_path, home).stdout)
    targets = [
        argv[argv.index("--target") + 1] for name, _, argv in steps if name.startswith("bench")
    ]
    assert targets == ["smollm2-135m-instruct", "smollm2-135m-instruct"]


def test_planned_commands_are_valid_for_their_programs():
    """The e2e overrides are a valid config and the benchmark takes the options used."""
    cfg = load_config(REPO / "configs" / "tiny.yaml", E2E_OVERRIDES)
    assert (cfg.data.backend, cfg.evaluate.backend, cfg.run.device) == ("vllm", "vllm", "cuda")
    assert cfg.evaluate.k_sweep == [cfg.evaluate.num_speculative_tokens]  # no extra engine
    assert cfg.distill.max_steps % cfg.distill.save_every == 0  # checkpoints 0 and last only
    helped = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_specdec.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0
    for option in ("--device", "--target", "--k", "--dtype"):
        assert option in helped.stdout
