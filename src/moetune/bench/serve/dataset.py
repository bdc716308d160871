"""Prompts with exact token counts, counted by the server itself.

A prompt's length is what the server will process: the chat template applied to the messages
(``/apply-template``), tokenized with the model's own tokenizer (``/tokenize`` with special tokens,
as the chat endpoint does). No Hugging Face tokenizer is needed, and the count is exact for the
model being served.

Synthetic prompts are grown or shrunk a whole character at a time until the templated prompt has
exactly the asked number of tokens; text is never cut at the byte or token level, so a multi-byte
character is never split. Each prompt starts with a tag unique to the run and the request, so the
server's prefix cache cannot serve one request from another's prompt (the request also sets
``cache_prompt: false``); ``--prefix-cache`` turns both off.

A server without ``/tokenize`` and ``/apply-template`` (vLLM, SGLang, LM Studio, Ollama) counts
through its own answers instead (:class:`UsageTokenCounter`: ``usage.prompt_tokens`` of a request
for one token). Such a count is a request, and on a server whose prefix cache ignores
``cache_prompt: false`` it would also put the prompt in that cache, so only one probe prompt is
fitted (:func:`probed_prompts`), behind a tag of the same shape as the requests' own but never
sent again; the prompts the benchmark sends are not counted beforehand (``prompt_tokens`` None),
and their lengths are the server's ``usage.prompt_tokens`` of each request.

ShareGPT files (a JSON list, or JSON lines, of ``{"conversations": [{"from": "human", "value":
...}, {"from": "gpt", "value": ...}]}``) give real prompts: the first human turn is the prompt,
the first reply after it sets the output length unless ``--output-len`` is given.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from moetune.bench.http.client import StreamingHttp
from moetune.bench.serve.load import Prompt
from moetune.bench.serve.request import CHAT_PATH
from moetune.engine import auth
from moetune.errors import InputError, RuntimeFailure

# filler words; a few are multi-byte in UTF-8, so the fitting is exercised on them too
WORDS = (
    "the",
    "model",
    "expert",
    "router",
    "layer",
    "token",
    "cache",
    "memory",
    "device",
    "bandwidth",
    "prefill",
    "decode",
    "batch",
    "slot",
    "server",
    "request",
    "latency",
    "throughput",
    "tensor",
    "weight",
    "gate",
    "attention",
    "context",
    "queue",
    "stream",
    "kernel",
    "buffer",
    "split",
    "offload",
    "quant",
    "sample",
    "measure",
    "café",
    "naïve",
    "über",
    "Straße",
    "日本語",
    "データ",
    "Ωmega",
    "ünïcode",
)


PADS = (".", "a", " a", ",", "-", " x.")  # tails that close the last few tokens' gap


class TokenCounter(Protocol):
    async def chat_tokens(self, content: str) -> int:
        """Tokens in the templated prompt of a one-message chat with this user content."""
        ...

    async def text_tokens(self, text: str) -> int:
        """Tokens in a plain text (no template, no special tokens)."""
        ...


class ServerTokenCounter:
    """Counts through llama-server's ``/apply-template`` and ``/tokenize``."""

    def __init__(self, http: StreamingHttp, thinking: bool | None = None) -> None:
        self.http = http
        self.thinking = thinking
        self.calls = 0

    async def _post(self, path: str, doc: dict[str, object]) -> dict[str, object]:
        self.calls += 1
        status, body = await self.http.post_json(path, doc)
        if status != 200 or not isinstance(body, dict):
            raise RuntimeFailure(
                f"{path} answered HTTP {status}: {str(body)[:200]}",
                hint="serve-bench counts prompt tokens with llama-server's /apply-template "
                "and /tokenize; point it at a llama-server",
            )
        return body

    async def chat_tokens(self, content: str) -> int:
        req: dict[str, object] = {"messages": [{"role": "user", "content": content}]}
        if self.thinking is not None:
            req["chat_template_kwargs"] = {"enable_thinking": self.thinking}
        prompt = (await self._post("/apply-template", req)).get("prompt")
        if not isinstance(prompt, str):
            raise RuntimeFailure("/apply-template gave no prompt")
        return await self._count(prompt, add_special=True)

    async def text_tokens(self, text: str) -> int:
        return await self._count(text, add_special=False)

    async def _count(self, text: str, *, add_special: bool) -> int:
        toks = (
            await self._post("/tokenize", {"content": text, "add_special": add_special, "parse_special": True})
        ).get("tokens")
        if not isinstance(toks, list):
            raise RuntimeFailure("/tokenize gave no tokens")
        return len(toks)


class UsageTokenCounter:
    """Counts through the server's answer to a chat request for one token (not streamed): its
    ``usage.prompt_tokens`` is the templated prompt's length, for servers without ``/tokenize``."""

    def __init__(self, http: StreamingHttp, model: str, thinking: bool | None = None) -> None:
        self.http, self.model, self.thinking = http, model, thinking
        self.calls = 0

    async def chat_tokens(self, content: str) -> int:
        req: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 1,
            "stream": False,
        }
        if self.thinking is not None:
            req["chat_template_kwargs"] = {"enable_thinking": self.thinking}
        self.calls += 1
        status, body = await self.http.post_json(CHAT_PATH, req)
        usage = body.get("usage") if isinstance(body, dict) else None
        n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if status != 200 or not isinstance(n, int):
            raise RuntimeFailure(
                f"{CHAT_PATH} answered HTTP {status} without usage.prompt_tokens: {str(body)[:200]}",
                hint=auth.refused_hint(
                    status,
                    "serve-bench sizes prompts by the server's own "
                    "count: without /tokenize it needs usage in chat responses "
                    "(every OpenAI-compatible server sends it; check --model and "
                    "the server's log)",
                ),
            )
        return n

    async def text_tokens(self, text: str) -> int:
        raise uncountable_replies()


def uncountable_replies() -> InputError:
    return InputError(
        "this server has no /tokenize, so the dataset's replies cannot be counted to set each request's output length",
        hint="give --output-len N",
    )


def filler_text(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def request_tag(run_tag: str, i: int, width: int = 0) -> str:
    """A short prefix unique to the run and the request (a few tokens); ``width`` pads the index
    with zeros, so that every tag of a run has the same shape (:func:`probed_prompts`)."""
    return f"{run_tag}.{i:0{width}d} "


async def fit_content(
    counter: TokenCounter, prefix: str, filler: str, *, target: int, start: int, per_char: float | None = None
) -> tuple[str, int]:
    """``prefix + filler[:n]`` whose templated prompt has ``target`` tokens (or the largest count
    below it when no cut hits it exactly). ``start`` is the first guess for n; ``per_char`` (tokens
    per character) the step size, measured here when not given."""
    cache: dict[int, int] = {}

    async def count(n: int) -> int:
        if n not in cache:
            cache[n] = await counter.chat_tokens(prefix + filler[:n])
        return cache[n]

    lo, hi = 0, len(filler)  # count(lo) <= target < count(hi), as far as measured
    if per_char is None:
        if await count(0) > target:
            raise InputError(
                f"--input-len {target} is shorter than the prompt's fixed part "
                f"({cache[0]} tokens: chat template and request tag)",
                hint=f"use --input-len {cache[0]} or more",
            )
        if await count(hi) < target:
            return prefix + filler, cache[hi]
        per_char = (cache[hi] - cache[0]) / max(1, hi)
    per_char = max(per_char, 1e-3)
    n = min(max(start, 1), hi)
    for _ in range(64):
        c = await count(n)
        if c == target:
            return prefix + filler[:n], c
        if c < target:
            lo = max(lo, n)
        else:
            hi = min(hi, n)
        if hi - lo <= 1:
            break
        step = round((target - c) / per_char) or (1 if c < target else -1)
        n = min(max(n + step, lo + 1), hi - 1)
    # no cut gives exactly target (the next character is several tokens): end the longest cut
    # below it, or one a little shorter, with a short ASCII tail
    best = max((k for k, v in cache.items() if v <= target), default=0)
    for k in range(best, max(-1, best - 3), -1):
        for tail in PADS:
            text = prefix + filler[:k] + tail
            if await counter.chat_tokens(text) == target:
                return text, target
    return prefix + filler[:best], await count(best)


async def _filler(counter: TokenCounter, input_len: int, seed: int) -> str:
    """Text of at least ``input_len`` tokens, and not many times more: a count of 64 words gives the
    tokens per word, and the text is sized to about 1.25 x ``input_len`` from it (a server that can
    only count by answering must not be sent a probe beyond its context: with a byte-level
    vocabulary a word is five or six tokens)."""
    sample = filler_text(seed, 64)
    per_word = max(0.5, await counter.chat_tokens(sample) / 64)
    words = max(64, int(1.25 * input_len / per_word) + 8)
    filler = filler_text(seed, words)
    while await counter.chat_tokens(filler) < input_len:
        filler = filler + " " + filler_text(seed + len(filler), max(16, words // 4))
    return filler


async def synthetic_prompts(
    counter: TokenCounter, n: int, input_len: int, output_len: int, *, seed: int, run_tag: str, unique: bool
) -> list[Prompt]:
    """``n`` prompts of exactly ``input_len`` tokens (templated) asking for ``output_len`` tokens."""
    filler = await _filler(counter, input_len, seed)
    out: list[Prompt] = []
    start = len(filler) // 2
    per_char: float | None = None
    for i in range(n if unique else 1):
        prefix = request_tag(run_tag, i) if unique else ""
        text, count = await fit_content(counter, prefix, filler, target=input_len, start=start, per_char=per_char)
        if per_char is None:
            per_char = max(1e-3, count / max(1, len(text)))
        start = len(text) - len(prefix)
        out.append(Prompt(text, count, output_len))
    return out if unique else out * n


async def probed_prompts(
    counter: TokenCounter, n: int, input_len: int, output_len: int, *, seed: int, run_tag: str, unique: bool
) -> list[Prompt]:
    """``n`` prompts of about ``input_len`` tokens for a server that counts only by answering: one
    probe prompt is fitted exactly, behind the tag with index ``n`` (which no request carries),
    and every request gets the same text behind its own tag of the same shape. Their lengths are
    not counted before sending (``prompt_tokens`` None): the server's ``usage`` says them."""
    filler = await _filler(counter, input_len, seed)
    width = len(str(n))
    probe_tag = request_tag(run_tag, n, width) if unique else ""
    text, count = await fit_content(counter, probe_tag, filler, target=input_len, start=len(filler) // 2)
    body = text[len(probe_tag) :]
    if not unique:  # the same prompt for every request: the one counted
        return [Prompt(body, count, output_len)] * n
    return [Prompt(request_tag(run_tag, i, width) + body, None, output_len) for i in range(n)]


def load_sharegpt(path: Path) -> list[tuple[str, str | None]]:
    """(first human turn, first reply after it) from a ShareGPT JSON or JSON-lines file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"--dataset {path}: {e.strerror or e}") from None
    try:
        rows: Any = json.loads(text)
    except ValueError:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise InputError(f"--dataset {path}: neither JSON nor JSON lines ({e})") from None
    if isinstance(rows, dict):
        rows = rows.get("data") or rows.get("conversations") or [rows]
    pairs: list[tuple[str, str | None]] = []
    for row in rows if isinstance(rows, list) else []:
        turns = row.get("conversations") or row.get("messages") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            continue
        prompt: str | None = None
        reply: str | None = None
        for t in turns:
            if not isinstance(t, dict):
                continue
            who = str(t.get("from") or t.get("role") or "")
            value = t.get("value", t.get("content"))
            if not isinstance(value, str):
                continue
            if prompt is None and who in ("human", "user"):
                prompt = value
            elif prompt is not None and who in ("gpt", "assistant", "chatgpt", "bard", "model"):
                reply = value
                break
        if prompt and prompt.strip():
            pairs.append((prompt, reply))
    if not pairs:
        raise InputError(
            f"--dataset {path}: no conversations with a human turn",
            hint='expected ShareGPT records: {"conversations": [{"from": "human", "value": "..."}, '
            '{"from": "gpt", "value": "..."}]}',
        )
    return pairs


@dataclass(frozen=True, slots=True)
class DatasetPick:
    prompts: list[Prompt]
    skipped_overlong: int  # prompt + output longer than the per-slot context
    skipped_no_reply: int  # no reply to take the output length from


async def dataset_prompts(
    counter: TokenCounter | None,
    pairs: Sequence[tuple[str, str | None]],
    n: int,
    *,
    output_len: int | None,
    n_ctx_slot: int | None,
    seed: int,
    run_tag: str,
    unique: bool,
) -> DatasetPick:
    """``n`` prompts drawn from ``pairs`` (shuffled by ``seed``; reused with new tags when the
    dataset is smaller than ``n``), skipping those that do not fit a slot's context. Without a
    ``counter`` (a server with no /tokenize) prompts are not counted, nor skipped, and
    ``output_len`` is needed."""
    if counter is None and output_len is None:
        raise uncountable_replies()
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    out: list[Prompt] = []
    overlong = no_reply = 0
    tried = 0
    while len(out) < n:
        if tried >= len(order) and not out:
            break
        content, reply = pairs[order[tried % len(order)]]
        tag = request_tag(run_tag, tried) if unique else ""
        tried += 1
        first_pass = tried <= len(order)
        if tried > 20 * max(n, len(order)):
            break
        if output_len is not None:
            m = output_len
        elif reply and counter is not None:
            m = max(1, await counter.text_tokens(reply))
        else:
            no_reply += first_pass
            continue
        p = None if counter is None else await counter.chat_tokens(tag + content)
        if p is not None and n_ctx_slot is not None and p + m > n_ctx_slot:
            overlong += first_pass
            continue
        out.append(Prompt(tag + content, p, m))
    if not out:
        raise InputError(
            f"no prompt in the dataset fits: {overlong} longer than the per-slot context "
            f"({n_ctx_slot} tokens), {no_reply} without a reply to set the output length",
            hint="give --output-len, or start the server with a larger context per slot",
        )
    return DatasetPick(out, overlong, no_reply)
