"""Questions: the formats and the documented answer rule."""

from __future__ import annotations

import json

import pytest

from moetune.errors import InputError
from moetune.quality import qa

Q = qa.Question("q", "Which?", ("red apple", "blue sky", "green grass"), 1)


@pytest.mark.parametrize(
    ("reply", "letter"),
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B.", "B"),
        ("Answer: C", "C"),
        ("Ｂ", "B"),  # full width, NFKC
        ("<think>maybe A</think>C", "C"),
        ("<think>A or B", None),  # an unclosed think block hides all
        ("the blue sky, of course", "B"),  # no letter: exactly one choice's text
        ("Because", None),
        ("apple or grass", None),
        ("", None),  # a letter inside a word is no answer
        ("D", None),  # not one of its letters
    ],
)
def test_answer_rule(reply: str, letter: str | None) -> None:
    assert qa.extract(reply, Q) == letter


def test_prompt_letters_the_choices() -> None:
    p = qa.prompt(Q)
    assert "A. red apple\nB. blue sky\nC. green grass" in p and p.endswith(qa.INSTRUCTION)


def test_jcommonsenseqa_converted() -> None:
    line = {
        "q_id": 8939,
        "question": "電車に乗るときに必要なものは？",
        "choice0": "切符",
        "choice1": "傘",
        "choice2": "鍋",
        "choice3": "枕",
        "choice4": "靴下",
        "label": 0,
    }
    [q] = qa.parse_questions(json.dumps(line, ensure_ascii=False), "jcommonsenseqa")
    assert q.id == "8939" and len(q.choices) == 5 and qa.right_letter(q) == "A"


def test_bad_lines_are_named() -> None:
    with pytest.raises(InputError, match=r"x:2: answer 7 is outside its 2 choices"):
        qa.parse_questions(
            '{"question": "a", "choices": ["x", "y"], "answer": 0}\n'
            '{"question": "b", "choices": ["x", "y"], "answer": 7}',
            source="x",
        )
    with pytest.raises(InputError, match="more than once"):
        qa.parse_questions('{"id": "1", "question": "a", "choices": ["x", "y"], "answer": "B"}\n' * 2)


def test_shipped_set_reads() -> None:
    from importlib import resources

    path = resources.files("moetune.quality") / "data" / "qa-sample.jsonl"
    qs = qa.parse_questions(path.read_text(encoding="utf-8"))
    assert len(qs) == 20 and all(2 <= len(q.choices) <= 10 for q in qs)
