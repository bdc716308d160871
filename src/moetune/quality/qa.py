"""Multiple-choice questions: the file formats, the prompt, and the rule that reads an answer. Pure.

moetune's format is JSON lines, one question each::

    {"id": "sky-1", "question": "What colour is a clear daytime sky?", "choices": ["green", "blue", "red"], "answer": 1}

``answer`` is the 0-based index of the right choice (or its letter, ``"B"``). JCommonsenseQA
(JGLUE, ``--qa-format jcommonsenseqa``) is converted from its own lines: ``q_id``, ``question``,
``choice0`` ... ``choice4``, ``label`` (the right choice's index).

The prompt (:func:`prompt`) is the question, the choices lettered ``A.``, ``B.``, ... one per line,
and "Answer with the letter of the correct choice only." The answer rule (:func:`extract`):

1. drop any ``<think>...</think>`` block (and an unclosed one to the end);
2. NFKC-normalise, so full-width letters (``Ｂ``) read as ASCII;
3. the first choice letter that stands alone (not inside a word: ``B``, ``(B)``, ``B.``,
   ``Answer: B``) is the answer;
4. else, when exactly one choice's text appears in the reply, that choice;
5. else the reply is unparsable: counted as wrong, and reported as unparsable.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import InputError

LETTERS = "ABCDEFGHIJ"
INSTRUCTION = "Answer with the letter of the correct choice only."
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    question: str
    choices: tuple[str, ...]
    answer: int  # index of the right choice

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.choices)]

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "question": self.question, "choices": list(self.choices), "answer": self.answer}


def _answer_index(v: object, n: int, where: str) -> int:
    if isinstance(v, bool):
        raise InputError(f"{where}: answer {v!r} is neither a choice index nor a letter")
    if isinstance(v, int):
        i = v
    elif isinstance(v, str) and len(v.strip()) == 1 and v.strip().upper() in LETTERS:
        i = LETTERS.index(v.strip().upper())
    else:
        raise InputError(
            f"{where}: answer {v!r} is neither a choice index (0-based) nor a letter",
            hint='write "answer": 1 or "answer": "B"',
        )
    if not 0 <= i < n:
        raise InputError(f"{where}: answer {v!r} is outside its {n} choices")
    return i


def question_of(d: object, where: str) -> Question:
    """One line of moetune's format."""
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected an object with question, choices and answer")
    q, choices = d.get("question"), d.get("choices")
    if not isinstance(q, str) or not q.strip():
        raise InputError(f"{where}: no question text")
    if (
        not isinstance(choices, list)
        or not 2 <= len(choices) <= len(LETTERS)
        or not all(isinstance(c, str) and c.strip() for c in choices)
    ):
        raise InputError(f"{where}: choices must be a list of 2 to {len(LETTERS)} non-empty strings")
    return Question(str(d.get("id", where)), q, tuple(choices), _answer_index(d.get("answer"), len(choices), where))


def from_jcommonsenseqa(d: object, where: str) -> Question:
    """One line of JCommonsenseQA (JGLUE): q_id, question, choice0..choice4, label."""
    if not isinstance(d, dict) or "question" not in d or "label" not in d:
        raise InputError(
            f"{where}: not a JCommonsenseQA line (q_id, question, choice0..choice4, label)",
            hint="moetune's own format is --qa-format jsonl",
        )
    choices: list[object] = []
    while f"choice{len(choices)}" in d:
        choices.append(d[f"choice{len(choices)}"])
    return question_of(
        {"id": str(d.get("q_id", where)), "question": d["question"], "choices": choices, "answer": d["label"]}, where
    )


READERS = {"jsonl": question_of, "jcommonsenseqa": from_jcommonsenseqa}


def parse_questions(text: str, fmt: str = "jsonl", source: str = "questions") -> list[Question]:
    """Every non-blank line of ``text`` as a question (a JSON array of objects is read too)."""
    read = READERS[fmt]
    stripped = text.strip()
    items: list[tuple[object, str]]
    if stripped.startswith("["):
        try:
            arr = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise InputError(f"{source}: not valid JSON: {e}") from None
        items = [(x, f"{source} item {i + 1}") for i, x in enumerate(arr)]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((json.loads(line), f"{source}:{n}"))
            except json.JSONDecodeError as e:
                raise InputError(f"{source}:{n}: not a JSON line: {e.msg}") from None
    qs = [read(x, where) for x, where in items]
    if not qs:
        raise InputError(f"{source}: no questions", hint="one JSON object per line")
    ids = [q.id for q in qs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InputError(f"{source}: question id {dup!r} appears more than once (answers are paired by id)")
    return qs


def read_questions(path: Path, fmt: str = "jsonl") -> list[Question]:
    from moetune.paths import readable_file

    readable_file(path, "question file")
    return parse_questions(path.read_text(encoding="utf-8-sig"), fmt, str(path))


def prompt(q: Question) -> str:
    lines = [q.question.strip(), ""]
    lines += [f"{letter}. {c.strip()}" for letter, c in zip(q.letters, q.choices, strict=False)]
    return "\n".join([*lines, "", INSTRUCTION])


def extract(reply: str, q: Question) -> str | None:
    """The letter a reply gives, by the rule in the module docstring; None when unparsable."""
    text = unicodedata.normalize("NFKC", _THINK.sub("", reply)).strip()
    m = re.search(rf"(?<![A-Za-z0-9])([{q.letters}])(?![A-Za-z0-9])", text)
    if m:
        return m[1]
    low = text.casefold()
    hits = [i for i, c in enumerate(q.choices) if unicodedata.normalize("NFKC", c.strip()).casefold() in low]
    return q.letters[hits[0]] if len(hits) == 1 else None


def right_letter(q: Question) -> str:
    return q.letters[q.answer]


def graded(replies: Sequence[str], qs: Sequence[Question]) -> list[tuple[str | None, bool]]:
    out = []
    for r, q in zip(replies, qs, strict=True):
        a = extract(r, q)
        out.append((a, a == right_letter(q)))
    return out
