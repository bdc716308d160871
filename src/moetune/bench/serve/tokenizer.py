"""Prompt lengths from a Hugging Face ``tokenizer.json`` (``serve-bench --tokenizer``), for a server
without llama-server's ``/tokenize`` and ``/apply-template`` (vLLM, SGLang, LM Studio, Ollama).

The tokenizer counts a message's content; what the server's chat template adds around it (role
markers, BOS, the assistant's header) is measured once per run: the ``usage.prompt_tokens`` of a
request for one token whose content is a short probe text, minus the tokenizer's count of that
text. A prompt's length is then the tokenizer's count of its content plus that overhead, so
synthetic prompts are fitted to ``--input-len`` and a dataset's prompts and replies are counted
before sending, without a request per prompt. A second probe, about a hundred words long, checks
the prediction before the run (a tokenizer that is not the served model's shows up there); after
the run each request's predicted length is compared with the server's ``usage.prompt_tokens``
(``prompt_token_error`` in each level, :mod:`moetune.bench.analysis.serve`).

The ``tokenizers`` package is optional (``pip install 'moetune[tokenizers]'``); it is imported
only when ``--tokenizer`` is given.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.bench.http.client import StreamingHttp
from moetune.bench.serve.dataset import ServerTokenCounter, UsageTokenCounter, filler_text
from moetune.errors import InputError
from moetune.store.record import ServerInfo

if TYPE_CHECKING:
    from tokenizers import Tokenizer

INSTALL = "pip install 'moetune[tokenizers]'"
CHECK_WORDS = 100  # words of the probe that checks the prediction before the run
SOURCE = "tokenizer"  # a prompt's and a sample's ``prompt_source`` when its length was predicted here


@dataclass(frozen=True, slots=True)
class LocalTokenizer:
    """A loaded ``tokenizer.json``: its path, its sha256 (stored with the run) and the tokenizer."""

    path: Path
    sha256: str
    tokenizer: Tokenizer

    def count(self, text: str) -> int:
        """Tokens of ``text`` as message content: no special tokens (the template's overhead has them)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_tokenizer(path: Path) -> LocalTokenizer:
    """Load ``path`` (a Hugging Face ``tokenizer.json``); an :class:`InputError` (exit 2) says why not."""
    if importlib.util.find_spec("tokenizers") is None:  # an optional dependency
        raise InputError("--tokenizer needs the Python package `tokenizers`, which is not installed", hint=INSTALL)
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(f"--tokenizer {path}: {e.strerror or e}") from None
    if not path.is_file():
        raise InputError(
            f"--tokenizer {path}: not a file",
            hint="give the model's tokenizer.json (a file in its Hugging Face repository)",
        )
    return _load(str(path.resolve()), st.st_mtime_ns, st.st_size, str(path))


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int, given: str) -> LocalTokenizer:
    """Loaded once per file version: a run checks it before starting and uses it once the server answers."""
    from tokenizers import Tokenizer

    what = f"--tokenizer {given}"
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{what}: {e.strerror or e}") from None
    hint = "give the served model's tokenizer.json, from its Hugging Face repository"
    if data[:4] == b"GGUF":
        raise InputError(f"{what}: a GGUF file; --tokenizer reads a Hugging Face tokenizer.json", hint=hint)
    try:
        doc: Any = json.loads(data)
    except ValueError as e:  # UnicodeDecodeError included
        raise InputError(f"{what}: not JSON ({e})", hint=hint) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise InputError(f'{what}: JSON, but not a tokenizer (no "model" object)', hint=hint)
    try:
        tok = Tokenizer.from_str(data.decode())
    except Exception as e:  # the Rust side raises plain Exceptions
        raise InputError(
            f"{what}: not a tokenizer the `tokenizers` package reads ({str(e)[:200]})", hint=hint
        ) from None
    return LocalTokenizer(Path(path), hashlib.sha256(data).hexdigest(), tok)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The chat template's overhead in tokens, and the check before the run: a longer probe's
    length by the server (``check_tokens``) against the prediction (``check_predicted``)."""

    overhead_tokens: int
    check_tokens: int
    check_predicted: int
    probe_requests: int

    @property
    def check_error_pct(self) -> float:
        return 100 * abs(self.check_predicted - self.check_tokens) / max(1, self.check_tokens)

    def to_json(self) -> dict[str, object]:
        return {
            "template_tokens": self.overhead_tokens,
            "check_tokens": self.check_tokens,
            "check_predicted": self.check_predicted,
            "check_error_pct": round(self.check_error_pct, 3),
            "probe_requests": self.probe_requests,
        }


class TokenizerCounter:
    """A :class:`moetune.bench.serve.dataset.TokenCounter`: the tokenizer's count of the content plus
    the template's overhead, calibrated by two probe requests (``server``) before the first count."""

    def __init__(self, tokenizer: LocalTokenizer, server: UsageTokenCounter, *, probe_tag: str, seed: int = 0) -> None:
        self.tokenizer, self.server = tokenizer, server
        self.probe_tag, self.seed = probe_tag, seed
        self.calibration: Calibration | None = None

    @property
    def calls(self) -> int:
        """Probe requests sent (the counts themselves are local)."""
        return self.server.calls

    async def calibrate(self) -> Calibration:
        """Measure the overhead (once) on the probe tag alone, and check it on the tag and some text
        (probe texts carry a tag no request does: none of them sits in the server's prefix cache
        as a request's prompt)."""
        if self.calibration is None:
            short = self.probe_tag
            overhead = await self.server.chat_tokens(short) - self.tokenizer.count(short)
            text = f"{self.probe_tag} {filler_text(self.seed + 7, CHECK_WORDS)}"
            served = await self.server.chat_tokens(text)
            self.calibration = Calibration(overhead, served, self.tokenizer.count(text) + overhead, 2)
        return self.calibration

    async def chat_tokens(self, content: str) -> int:
        cal = await self.calibrate()
        return self.tokenizer.count(content) + cal.overhead_tokens

    async def text_tokens(self, text: str) -> int:
        return self.tokenizer.count(text)

    def describe(self) -> dict[str, object]:
        """What the run stores about its prompt counting."""
        return {
            "path": str(self.tokenizer.path),
            "sha256": self.tokenizer.sha256,
            **(self.calibration.to_json() if self.calibration else {}),
        }


Counter = ServerTokenCounter | UsageTokenCounter | TokenizerCounter


def token_counter(
    http: StreamingHttp,
    info: ServerInfo,
    model: str,
    thinking: bool | None,
    *,
    tokenizer: Path | None = None,
    log: Callable[[str], None] = lambda s: None,
    probe_tag: str = "",
    seed: int = 0,
) -> Counter:
    """How a run counts prompts: llama-server's template and tokenizer where the server has them
    (a ``tokenizer`` given is then not used, and ``log`` says so); else the ``tokenizer.json``
    given, its template overhead measured by probes whose text is ``probe_tag``; else the
    server's answers' usage."""
    if info.caps.exact_prompts:
        if tokenizer is not None:
            log(f"--tokenizer {tokenizer} is not used: the server counts prompts itself (/tokenize)")
        return ServerTokenCounter(http, thinking)
    usage = UsageTokenCounter(http, model, thinking)
    if tokenizer is None:
        return usage
    return TokenizerCounter(load_tokenizer(tokenizer), usage, probe_tag=probe_tag, seed=seed)


def prepared_line(what: str, counter: Counter, took_s: float) -> str:
    """What preparing ``what`` (e.g. "34 prompts") took, and how they were counted."""
    if isinstance(counter, ServerTokenCounter):
        return f"prepared {what} with exact token counts ({counter.calls} tokenizer calls, {took_s:.1f} s)"
    if isinstance(counter, TokenizerCounter) and counter.calibration is not None:
        cal = counter.calibration
        return (
            f"prepared {what} counted by --tokenizer plus {cal.overhead_tokens} template tokens ({counter.calls} "
            f"probe requests; a probe of {cal.check_tokens} tokens predicted within {cal.check_error_pct:.1f}%, "
            f"{took_s:.1f} s)"
        )
    return (
        f"prepared {what}; the server has no /tokenize, so their lengths are its usage.prompt_tokens "
        f"({counter.calls} probe requests, {took_s:.1f} s)"
    )
