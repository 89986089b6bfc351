"""Prompt sources, rendering and the train/eval split (no model needed, except a tokenizer)."""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter

import datasets
import pytest

from draftsmith.config import PromptSource
from draftsmith.data.sources import Prompt, dedupe, load_prompts, load_source, read_builtin, render
from draftsmith.data.split import allocate, balanced_take, split_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.models import build_byte_tokenizer

RECORDS = [
    {"prompt": "Write a haiku about rain.", "category": "writing"},
    {"prompt": "What is 2 + 2?", "category": "math"},
    {"prompt": "Explain DNS.", "category": "explanation"},
    {"prompt": "Write a haiku about rain.", "category": "writing"},  # duplicate
]


def write_all_formats(tmp_path):
    """The same records as .jsonl, .jsonl.gz, .json, .csv, .parquet and a saved dataset dir."""
    jsonl = "".join(json.dumps(r) + "\n" for r in RECORDS)
    (tmp_path / "p.jsonl").write_text(jsonl)
    (tmp_path / "p.jsonl.gz").write_bytes(gzip.compress(jsonl.encode()))
    (tmp_path / "p.json").write_text(json.dumps(RECORDS))
    with open(tmp_path / "p.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "category"])
        w.writeheader()
        w.writerows(RECORDS)
    ds = datasets.Dataset.from_list(RECORDS)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    return ["p.jsonl", "p.jsonl.gz", "p.json", "p.csv", "p.parquet", "saved"]


def test_every_file_format_gives_the_same_prompts(tmp_path):
    got = {
        name: load_source(PromptSource(path=str(tmp_path / name)), seed=0)
        for name in write_all_formats(tmp_path)
    }
    first = [(p.key, p.category) for p in got["p.jsonl"]]
    assert first == [(r["prompt"], r["category"]) for r in RECORDS[:3]]  # duplicate dropped
    for name, prompts in got.items():
        assert [(p.key, p.category) for p in prompts] == first, name
        assert {p.source for p in prompts} == {name}


def test_builtin_draftsmith_set_is_large_varied_and_unique():
    recs = read_builtin("draftsmith")
    cats = Counter(r["category"] for r in recs)
    assert len(recs) >= 300 and len(cats) >= 5
    assert min(cats.values()) >= 30  # every category is substantial
    texts = [r["prompt"] for r in recs]
    assert len(set(texts)) == len(texts)
    assert len({t.split()[0] for t in texts}) >= 40  # not one template repeated


def test_builtin_humaneval_comes_from_the_package():
    prompts = load_source(PromptSource(builtin="humaneval"), seed=0)
    assert len(prompts) == 164 and {p.category for p in prompts} == {"code"}
    assert any("def has_close_elements" in p.key for p in prompts)


def test_messages_field_and_categories(tmp_path):
    rows = [
        {
            "conv": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
            ],
            "kind": "chat",
        },
        {"conv": [{"role": "user", "content": "Name a prime."}]},
    ]
    f = tmp_path / "chat.json"
    f.write_text(json.dumps(rows))
    prompts = load_source(
        PromptSource(path=str(f), messages_field="conv", category_field="kind"), 0
    )
    # the trailing assistant turn is the part the target writes, so it is dropped
    assert prompts[0].messages == (("system", "Be terse."), ("user", "Hi"))
    assert [p.category for p in prompts] == ["chat", "general"]
    fixed = load_source(PromptSource(path=str(f), messages_field="conv", category="support"), 0)
    assert {p.category for p in fixed} == {"support"}


def test_limit_is_deterministic_and_category_balanced():
    a = load_source(PromptSource(builtin="draftsmith", limit=60), seed=3)
    b = load_source(PromptSource(builtin="draftsmith", limit=60), seed=3)
    assert [p.key for p in a] == [p.key for p in b] and len(a) == 60
    full = Counter(p.category for p in load_source(PromptSource(builtin="draftsmith"), 3))
    got = Counter(p.category for p in a)
    for cat, n in full.items():
        assert abs(got[cat] - 60 * n / sum(full.values())) < 1  # largest-remainder shares


def test_sources_mix_and_cross_source_duplicates_drop(tmp_path):
    f = tmp_path / "extra.jsonl"
    f.write_text(
        json.dumps({"prompt": "Why is the sky blue?"})
        + "\n"
        + json.dumps({"prompt": "A new one."})
        + "\n"
    )
    prompts, dropped = load_prompts(
        [PromptSource(builtin="draftsmith"), PromptSource(path=str(f))], 0
    )
    assert dropped == 1  # "Why is the sky blue?" is in the builtin set
    assert prompts[-1].key == "A new one." and prompts[-1].source == "extra.jsonl"


@pytest.mark.parametrize(
    "content, src_kw, match",
    [
        (None, {}, "prompt file not found"),
        ("", {}, "no prompts found"),
        ('{"text": "hi"}\n', {}, "record 0 has no field 'prompt'"),
        ('{"prompt": "hi"}\n{"prompt": "x"\n', {}, "line 2 is not valid JSON"),
        ('{"prompt": "hi"}\n', {"messages_field": "messages"}, "no field 'messages'"),
        ('{"prompt": ""}\n', {}, "not a non-empty string"),
    ],
)
def test_bad_prompt_files_give_one_line_naming_the_file(tmp_path, content, src_kw, match):
    f = tmp_path / "bad.jsonl"
    if content is not None:
        f.write_text(content)
    with pytest.raises(DraftsmithError, match=match) as e:
        load_source(PromptSource(path=str(f), **src_kw), 0)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_unsupported_extension(tmp_path):
    (tmp_path / "p.txt").write_text("hello")
    with pytest.raises(DraftsmithError, match="unsupported prompt file type '.txt'"):
        load_source(PromptSource(path=str(tmp_path / "p.txt")), 0)


def test_render_uses_chat_template_and_system_prompt():
    tok = build_byte_tokenizer()
    p = Prompt((("user", "Hi there"),), "chat", "t")
    assert (
        render(p, tok, True, None)
        == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    with_sys = render(p, tok, True, "Be kind.")
    assert with_sys.startswith("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\n")
    assert render(p, tok, False, None) == "Hi there"
    assert render(p, tok, False, "Be kind.") == "Be kind.\n\nHi there"


# ----------------------------------------------------------------------------- split


def fake_prompts(counts: dict[str, int]) -> list[Prompt]:
    return [
        Prompt((("user", f"{c} prompt {i}"),), c, "t") for c, n in counts.items() for i in range(n)
    ]


def test_allocate_is_proportional_with_largest_remainder():
    assert allocate({"a": 50, "b": 30, "c": 20}, 10) == {"a": 5, "b": 3, "c": 2}
    assert allocate({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}  # ties by name
    assert allocate({"a": 3, "b": 7}, 100) == {"a": 3, "b": 7}
    assert sum(allocate({"a": 17, "b": 29, "c": 54}, 33).values()) == 33


def test_split_is_disjoint_deterministic_and_stratified():
    items = fake_prompts({"code": 40, "math": 25, "writing": 10, "solo": 1})
    train, evals = split_prompts(items, 0.2, seed=0)
    assert not {p.key for p in train} & {p.key for p in evals}
    assert len(train) + len(evals) == len(items)
    assert Counter(p.category for p in evals) == {"code": 8, "math": 5, "writing": 2}
    again = split_prompts(list(reversed(items)), 0.2, seed=0)  # input order does not matter
    assert [p.key for p in again[1]] == [p.key for p in evals]
    other = split_prompts(items, 0.2, seed=1)
    assert {p.key for p in other[1]} != {p.key for p in evals}


def test_split_caps_keep_category_balance():
    items = fake_prompts({"code": 60, "math": 30, "writing": 30})
    train, evals = split_prompts(items, 0.25, seed=0, max_eval=8, max_train=40)
    assert Counter(p.category for p in evals) == {"code": 4, "math": 2, "writing": 2}
    assert Counter(p.category for p in train) == {"code": 20, "math": 10, "writing": 10}
    assert not {p.key for p in train} & {p.key for p in evals}
    uncapped_eval = {p.key for p in split_prompts(items, 0.25, seed=0)[1]}
    assert {p.key for p in evals} <= uncapped_eval  # the cap keeps a subset


def test_dedupe_keeps_first():
    a, b = Prompt((("user", "x"),), "c1", "s1"), Prompt((("user", "x"),), "c2", "s2")
    kept, dropped = dedupe([a, b])
    assert kept == [a] and dropped == 1
    assert balanced_take([a], 5, 0) == [a]


def test_hub_source_goes_through_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        return datasets.Dataset.from_list([{"question": "Hub prompt?", "topic": "qa"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    src = PromptSource(
        hub="org/prompts", hub_split="test", prompt_field="question", category_field="topic"
    )
    (p,) = load_source(src, 0)
    assert calls == [("org/prompts", "test")]
    assert (p.key, p.category, p.source) == ("Hub prompt?", "qa", "org/prompts")

    def offline(name, split):
        raise ConnectionError("Couldn't reach the Hugging Face Hub\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        DraftsmithError, match=r"^org/prompts: cannot load hub dataset: Couldn't reach"
    ):
        load_source(src, 0)
