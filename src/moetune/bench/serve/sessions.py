"""Agent sessions: what each turn of a growing conversation sends, given the replies so far.

Pure: no I/O, no clocks. The driver (:mod:`moetune.bench.serve.session_run`) sizes the texts,
sends the turns and records them; this module only says what a client sends.

A session is one conversation, as a coding agent or a chat client holds it:

- a system prompt (``system_tokens``), unique to the run and the session: it starts with a tag, so
  no session, and no other run, shares a prefix with another (each session's reuse is its own);
- then, turn after turn, a message (``turn_tokens``: a question, a tool's output, a file), sent with
  the whole history before it, and the model's reply (``output_len`` tokens, reasoning included),
  which the client appends to the history it sends next.

The reply is kept as the server sent it: its content, and, where the server separated the model's
reasoning (llama-server's ``reasoning_content``), that reasoning as ``reasoning_content`` on the
assistant message, which llama-server renders back through the chat template (``<think>…</think>``
for the common templates): the history then holds exactly the tokens the model generated, and a
server with a prefix cache reuses all of it. ``strip_thinking`` keeps the history as clients do
that drop the reasoning: no ``reasoning_content``, and every ``<think>…</think>`` block (an
unclosed one to the end) removed from the content. The prompt then departs from the server's
cached tokens where the last reply began, so the server evaluates that reply's content again
(the reasoning is gone, so the context is shorter): the cache-miss cost measured side by side.

Every turn's message is a user message: a tool's result as a ``tool`` message needs the tool
call a real model makes before it, which a benchmark cannot fake for every template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSpec:
    """The workload: ``sessions`` concurrent conversations of ``turns`` turns each."""

    sessions: int
    turns: int = 4
    system_tokens: int = 512
    turn_tokens: int = 128
    output_len: int = 64
    think_time_s: float = 0.0  # the client's pause between a reply and the next turn (a tool runs, a user reads)
    strip_thinking: bool = False
    sequential: bool = False  # the sessions one after another (`tune --objective turn`), not all at once

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1:
            raise ValueError("sessions and turns must be positive")
        if self.system_tokens < 1 or self.turn_tokens < 1 or self.output_len < 1:
            raise ValueError("token sizes must be positive")
        if self.think_time_s < 0:
            raise ValueError("think time must not be negative")

    @property
    def streams(self) -> int:
        """Requests in flight at once: one per session, or one with ``sequential``."""
        return 1 if self.sequential else self.sessions

    def context_need(self) -> int:
        """Tokens the last turn's prompt and reply take, chat template aside: what a slot must hold."""
        return self.system_tokens + self.turns * (self.turn_tokens + self.output_len)

    def to_json(self) -> dict[str, int | float | bool]:
        return {
            "sessions": self.sessions,
            "turns": self.turns,
            "system_tokens": self.system_tokens,
            "turn_tokens": self.turn_tokens,
            "output_len": self.output_len,
            "think_time_s": self.think_time_s,
            "strip_thinking": self.strip_thinking,
            **({"sequential": True} if self.sequential else {}),
        }


@dataclass(frozen=True, slots=True)
class Reply:
    """What the server streamed back for one turn."""

    content: str
    reasoning: str = ""  # reasoning_content (or reasoning) the server separated from the content


@dataclass(frozen=True, slots=True)
class SessionTexts:
    """One session's texts, sized in tokens: its system prompt and one message per turn."""

    system: str
    turns: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """One request of a session: the whole history, then the new message."""

    session: int
    turn: int  # 1-based
    history: tuple[dict[str, str], ...]
    max_tokens: int
    stripped_chars: int  # reasoning characters the client left out of this history
    prompt_tokens: None = None  # not counted before sending: the server's usage says the context

    def messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.history]


def strip_thinking(text: str) -> str:
    """``text`` without its ``<think>…</think>`` blocks (an unclosed one is removed to the end)."""
    return THINK_BLOCK.sub("", text)


def kept_message(reply: Reply, *, strip: bool) -> tuple[dict[str, str], int]:
    """The assistant message the client keeps for a reply, and how many reasoning characters it
    left out: as sent (``reasoning_content`` beside the content), or with the reasoning stripped."""
    if not strip:
        msg = {"role": "assistant", "content": reply.content}
        if reply.reasoning:
            msg["reasoning_content"] = reply.reasoning
        return msg, 0
    content = strip_thinking(reply.content)
    return {"role": "assistant", "content": content}, len(reply.reasoning) + len(reply.content) - len(content)


def turn_request(session: int, texts: SessionTexts, replies: Sequence[Reply], spec: SessionSpec) -> Turn:
    """The request of turn ``len(replies) + 1``: the system prompt, each earlier turn's message and
    the reply the client kept, then this turn's message."""
    t = len(replies)
    if t >= len(texts.turns):
        raise ValueError(f"session {session} has {len(texts.turns)} turns; turn {t + 1} asked")
    history: list[dict[str, str]] = [{"role": "system", "content": texts.system}]
    stripped = 0
    for msg, reply in zip(texts.turns, replies, strict=False):
        kept, n = kept_message(reply, strip=spec.strip_thinking)
        history += [{"role": "user", "content": msg}, kept]
        stripped += n
    history.append({"role": "user", "content": texts.turns[t]})
    return Turn(
        session=session, turn=t + 1, history=tuple(history), max_tokens=spec.output_len, stripped_chars=stripped
    )


def session_tag(run_tag: str, session: int) -> str:
    """The system prompt's first words: unique to the run and the session."""
    return f"{run_tag}.s{session} "
