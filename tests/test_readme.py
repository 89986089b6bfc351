"""The README's two set-up commands are the ones CI and users run."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    commands = _readme_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert "draftsmith run configs/smollm2-135m.yaml" in main_job
    assert "pytest" in tests
    for cmd in commands:  # torch first, from the CPU build, so pip never picks a CUDA build
        assert cmd.index("torch==2.13.0") < cmd.index("pip install -q -e")


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    line = ci[ci.index("# README-TEST-COMMAND") + 1]
    assert line.startswith(_readme_commands()[1] + " 2>&1 | tee")
