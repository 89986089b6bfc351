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
    assert "draftsmith run configs/qwen2.5-coder-1.5b.yaml" in main_job
    assert "pytest" in tests
    for cmd in commands:  # torch first, from the CPU build, so pip never picks a CUDA build
        assert cmd.index("torch==2.13.0") < cmd.index("pip install -q -e")


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    line = ci[ci.index("# README-TEST-COMMAND") + 1]
    assert line.startswith(_readme_commands()[1] + " 2>&1 | tee")


def _config_table_defaults() -> list[tuple[str, str, str]]:
    """(section, key, default) of the README config table's rows; a row naming several keys
    ("ttt_steps, ttt_loss_decay | 3, 0.5") gives one triple per key."""
    text = (REPO / "README.md").read_text()
    out = []
    for m in re.finditer(r"^\| ([a-z_.0-9]+) \| ([a-z_0-9, ]+) \| ([^|]+) \|", text, re.M):
        keys, defaults = m[2].split(", "), m[3].strip().split(", ")
        if len(keys) == len(defaults):
            out += [(m[1], k, d) for k, d in zip(keys, defaults)]
    return out


MISSING = object()


def test_config_table_defaults_are_the_code_defaults():
    """Every scalar default the README's config table states is the dataclass default (a
    default changed by measurement must change in both)."""
    from draftsmith.config import Config, config_to_dict, parse_override

    defaults = config_to_dict(Config())  # each kind's section under draft.<kind> too
    checked = []
    for section, key, default in _config_table_defaults():
        value = defaults
        for part in [*section.split("."), key]:
            value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
        if value is MISSING or isinstance(value, (list, dict)):
            continue  # a table of something else, or a default described in words ("all four")
        _, stated = parse_override(f"{section}.{key}={default.strip('`')}")  # as a user's override
        assert stated == value, (section, key, default, value)
        checked.append(f"{section}.{key}")
    assert "draft.eagle3.draft_vocab_size" in checked and len(checked) >= 25
