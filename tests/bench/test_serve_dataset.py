"""Prompts with exact token counts: fitting, multi-byte text, ShareGPT files."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from moetune.bench.serve.dataset import (
    WORDS,
    dataset_prompts,
    fit_content,
    load_sharegpt,
    synthetic_prompts,
)
from moetune.errors import InputError

TEMPLATE = "<|user|>\n{}\n<|assistant|>\n"


class ByteCounter:
    """Like a byte-vocabulary model: one token per UTF-8 byte, plus BOS."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat_tokens(self, content: str) -> int:
        self.calls += 1
        return 1 + len(TEMPLATE.format(content).encode())

    async def text_tokens(self, text: str) -> int:
        return len(text.encode())


class WordCounter(ByteCounter):
    """Like a BPE model: a word is one token, whatever its length; punctuation and spaces apart."""

    async def chat_tokens(self, content: str) -> int:
        self.calls += 1
        return 1 + len(re.findall(r"\w+|[^\w\s]", TEMPLATE.format(content)))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.mark.parametrize("counter_cls", [ByteCounter, WordCounter])
@pytest.mark.parametrize("target", [40, 64, 100, 257])
def test_synthetic_prompts_hit_the_length_exactly(counter_cls: type[ByteCounter], target: int) -> None:
    counter = counter_cls()
    ps = run(synthetic_prompts(counter, 6, target, 32, seed=1, run_tag="ab12", unique=True))
    assert len(ps) == 6
    for i, p in enumerate(ps):
        assert p.prompt_tokens == target
        assert run(counter.chat_tokens(p.content)) == target
        assert p.content.startswith(f"ab12.{i} ")
        assert p.max_tokens == 32
        p.content.encode("utf-8")  # whole characters only
    assert len({p.content for p in ps}) == 6
    # after the first prompt, each costs a few counts, not a search
    assert counter.calls < 40 + 6 * 6


def test_a_multibyte_character_is_never_split() -> None:
    # "日本語" is 9 bytes: a byte-level target inside it stops before a character, never in it,
    # and a one-byte ASCII tail makes up the count
    counter = ByteCounter()
    prefix_tokens = run(counter.chat_tokens("x"))
    text, n = run(fit_content(counter, "x", "日本語日本語", target=prefix_tokens + 4, start=1))
    assert (text, n) == ("x日.", prefix_tokens + 4)
    text, n = run(fit_content(counter, "x", "日本語日本語", target=prefix_tokens + 8, start=1))
    assert (text, n) == ("x日本 a", prefix_tokens + 8)
    assert "日本語" in WORDS


def test_shared_prompts_when_the_prefix_cache_is_wanted() -> None:
    ps = run(synthetic_prompts(ByteCounter(), 4, 50, 8, seed=0, run_tag="t", unique=False))
    assert len({p.content for p in ps}) == 1 and ps[0].prompt_tokens == 50


def test_input_len_shorter_than_the_template() -> None:
    with pytest.raises(InputError, match="fixed part"):
        run(synthetic_prompts(ByteCounter(), 1, 10, 8, seed=0, run_tag="t", unique=True))


def write(path: Path, rows: object) -> Path:
    path.write_text(json.dumps(rows))
    return path


def test_sharegpt_formats(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hi ü"}, {"from": "gpt", "value": "Hello!"}]},
        {"id": "b", "conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "Q2"}]},
        {"id": "c", "conversations": [{"from": "gpt", "value": "orphan"}]},
        {"messages": [{"role": "user", "content": "Q3"}, {"role": "assistant", "content": "A3"}]},
    ]
    assert load_sharegpt(write(tmp_path / "d.json", rows)) == [("Hi ü", "Hello!"), ("Q2", None), ("Q3", "A3")]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert len(load_sharegpt(tmp_path / "d.jsonl")) == 3
    with pytest.raises(InputError, match="no conversations"):
        load_sharegpt(write(tmp_path / "e.json", [{"x": 1}]))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(InputError, match="neither JSON"):
        load_sharegpt(tmp_path / "bad.json")


def test_dataset_prompts_count_and_skip() -> None:
    pairs = [("short question", "a short answer"), ("x" * 500, "too long to fit"), ("no reply here", None)]
    pick = run(
        dataset_prompts(ByteCounter(), pairs, 4, output_len=None, n_ctx_slot=200, seed=0, run_tag="t", unique=True)
    )
    assert len(pick.prompts) == 4
    assert pick.skipped_overlong == 1 and pick.skipped_no_reply == 1
    for p in pick.prompts:
        assert p.content.endswith("short question")
        assert p.max_tokens == len(b"a short answer")
        assert p.prompt_tokens == run(ByteCounter().chat_tokens(p.content))
    assert len({p.content for p in pick.prompts}) == 4  # reused with fresh tags, never identical


def test_dataset_nothing_fits() -> None:
    with pytest.raises(InputError, match="no prompt in the dataset fits"):
        run(
            dataset_prompts(
                ByteCounter(), [("x" * 500, "y")], 2, output_len=10, n_ctx_slot=100, seed=0, run_tag="t", unique=True
            )
        )
