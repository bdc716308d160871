"""A mock of vLLM's OpenAI-compatible server, independent of :mod:`tests.bench.mock_server` (which
speaks llama-server's dialect): what `moetune bench` and `serve-bench` meet against vLLM, SGLang,
LM Studio or Ollama's OpenAI API.

What it serves, as vLLM does:

- ``GET /health``: 200 with an empty body (vLLM has it; LM Studio and Ollama do not, and moetune
  then falls back to ``/v1/models``: both paths are the same to it);
- ``GET /v1/models``: the one served model (``MockConfig.model``); a request naming another model
  gets vLLM's 404 ``NotFoundError``; a request naming none is served (vLLM's default);
- ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed or not. A stream opens
  with a role chunk (chat), then chunks that carry ``tokens_per_chunk[j % len]`` tokens each
  (vLLM coalesces tokens when its output processor falls behind, and with speculative decoding),
  then a chunk with ``finish_reason``; ``usage`` comes in a final chunk with empty ``choices``
  only when ``stream_options.include_usage`` is set, and in every chunk too (cumulative) when
  ``stream_options.continuous_usage_stats`` is set and ``continuous_usage`` allows it (vLLM and
  SGLang honour it; LM Studio and Ollama ignore it: ``continuous_usage=False``). No ``timings``,
  ever. ``usage.prompt_tokens_details.cached_tokens`` only with ``report_cached`` (vLLM's
  ``--enable-prompt-tokens-details``). Fields it does not know (``cache_prompt``,
  ``timings_per_token``, ``n_predict``...) are ignored, as vLLM ignores them (it logs them).
- everything else, ``/props``, ``/slots``, ``/tokenize``, ``/apply-template`` and
  ``/completion`` included, is 404 ``{"detail": "Not Found"}`` (FastAPI's). vLLM does have a
  ``/tokenize`` of its own, with another request schema (``prompt``, not ``content``); it is left
  out here, as moetune does not use it.

Its tokenizer differs from the llama mock's byte tokenizer on purpose: a token is a word or a
punctuation mark (:func:`count_tokens`) of the prompt as its chat template renders it
(:func:`template`), plus one BOS. With ``MockConfig.tokenizer`` (a Hugging Face ``tokenizer.json``)
a real tokenizer counts the templated prompt instead, special tokens included (its BOS, when its
post-processor adds one): what ``serve-bench --tokenizer`` predicts. Generated token k is the text ``" w<k>"``, so characters never
count tokens. Timing: the first token comes ``ttft_ms + prompt tokens x pp_ms_per_token`` after
the request arrived, each next one ``itl_ms`` later; a chunk is written when its last token is
due. ``GET /mock/log`` (not vLLM's: the tests' window into the truth) lists each completion's
prompt (templated) and its tokens, completion tokens, chunk sizes, write times and request fields.

It listens on 127.0.0.1 only. Run it as ``python tests/bench/vllm_mock.py --config JSON``; it
prints its URL on the first line of stdout. :func:`vllm_mock` starts it in a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

HOST = "127.0.0.1"  # never anything else
WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True, slots=True)
class MockConfig:
    model: str = "mock-org/Mock-MoE-30B"
    ttft_ms: float = 20.0
    pp_ms_per_token: float = 0.1
    itl_ms: float = 5.0
    tokens_per_chunk: tuple[int, ...] = (1, 3, 2)
    continuous_usage: bool = True  # honour stream_options.continuous_usage_stats (vLLM, SGLang)
    report_cached: bool = False  # usage.prompt_tokens_details.cached_tokens (always 0: no prefix cache here)
    eos_after: int | None = None  # stop (finish_reason "stop") after this many tokens unless ignore_eos
    max_model_len: int = 8192
    tokenizer: str | None = None  # a tokenizer.json that counts prompt tokens (else words and punctuation)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MockConfig:
        d = json.loads(text)
        if "tokens_per_chunk" in d:
            d["tokens_per_chunk"] = tuple(d["tokens_per_chunk"])
        return cls(**d)


def template(messages: list[dict[str, Any]]) -> str:
    """A ChatML-like template (not the llama mock's)."""
    return (
        "".join(f"<|im_start|>{m.get('role', 'user')}\n{m.get('content', '')}<|im_end|>\n" for m in messages)
        + "<|im_start|>assistant\n"
    )


def count_tokens(text: str) -> int:
    """Words and punctuation marks, plus a BOS."""
    return 1 + len(WORD.findall(text))


def chat_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return count_tokens(template(messages))


def token_text(k: int) -> str:
    return f" w{k}"


@dataclass(slots=True)
class MockState:
    requests: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str, kind: str) -> bytes:
    doc = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return _response(status, json.dumps(doc).encode())


class VllmMock:
    def __init__(self, cfg: MockConfig) -> None:
        self.cfg = cfg
        self.state = MockState()
        self.count = count_tokens
        if cfg.tokenizer is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(cfg.tokenizer)
            self.count = lambda text: len(tok.encode(text, add_special_tokens=True).ids)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                t_recv = time.monotonic()
                lines = head.decode("latin-1").split("\r\n")
                method, path = [*lines[0].split(" "), "", ""][:2]
                length = 0
                for h in lines[1:]:
                    k, _, v = h.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                body = await reader.readexactly(length) if length else b""
                await self.route(method, path.split("?", 1)[0], body, t_recv, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes, t_recv: float, w: asyncio.StreamWriter) -> None:
        cfg = self.cfg
        if method == "GET" and path == "/health":
            w.write(_response(200, b""))
        elif method == "GET" and path == "/v1/models":
            doc = {
                "object": "list",
                "data": [
                    {
                        "id": cfg.model,
                        "object": "model",
                        "owned_by": "vllm",
                        "root": cfg.model,
                        "max_model_len": cfg.max_model_len,
                    }
                ],
            }
            w.write(_response(200, json.dumps(doc).encode()))
        elif method == "GET" and path == "/mock/log":
            w.write(_response(200, json.dumps(self.state.log).encode()))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            try:
                req = json.loads(body)
            except ValueError as e:
                w.write(_error(400, f"invalid JSON: {e}", "BadRequestError"))
                return
            await self.complete(req, path == "/v1/chat/completions", t_recv, w)
        else:
            w.write(_response(404, b'{"detail":"Not Found"}'))

    def _prompt(self, req: dict[str, Any], chat: bool) -> tuple[str, int]:
        """The prompt as the model sees it, and its tokens."""
        if chat:
            text = template(req.get("messages") or [])
            return text, self.count(text)
        prompt = req.get("prompt", "")
        return (json.dumps(prompt), 1 + len(prompt)) if isinstance(prompt, list) else (prompt, self.count(prompt))

    async def complete(self, req: dict[str, Any], chat: bool, t_recv: float, w: asyncio.StreamWriter) -> None:
        cfg, st = self.cfg, self.state
        if req.get("model") not in (None, cfg.model):
            w.write(_error(404, f"The model `{req['model']}` does not exist.", "NotFoundError"))
            return
        prompt, n_prompt = self._prompt(req, chat)
        max_tokens = int(req.get("max_tokens") or 16)
        n_out = max_tokens if req.get("ignore_eos") or cfg.eos_after is None else min(max_tokens, cfg.eos_after)
        finish = "length" if n_out == max_tokens else "stop"
        no = st.requests
        st.requests += 1
        cid = f"{'chatcmpl' if chat else 'cmpl'}-mock{no}"
        entry: dict[str, Any] = {
            "id": cid,
            "chat": chat,
            "prompt": prompt,
            "prompt_tokens": n_prompt,
            "completion_tokens": n_out,
            "max_tokens": max_tokens,
            "stream_options": req.get("stream_options"),
            "fields": sorted(req),
            "model": req.get("model"),
            "stream": bool(req.get("stream")),
            "chunks": [],
            "writes": [],
        }
        st.log.append(entry)
        first = t_recv + (cfg.ttft_ms + cfg.pp_ms_per_token * n_prompt) / 1000
        due = [first + k * cfg.itl_ms / 1000 for k in range(n_out)]
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out, "completion_tokens": n_out}
        if cfg.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        obj = "chat.completion" if chat else "text_completion"
        if not req.get("stream"):
            if n_out:
                await asyncio.sleep(max(0.0, due[-1] - time.monotonic()))
            text = "".join(token_text(k) for k in range(n_out))
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            )
            doc = {
                "id": cid,
                "object": obj,
                "created": int(time.time()),
                "model": cfg.model,
                "choices": [{**choice, "logprobs": None, "finish_reason": finish}],
                "usage": usage,
            }
            w.write(_response(200, json.dumps(doc).encode()))
            return
        opts = req.get("stream_options") or {}
        include = bool(opts.get("include_usage"))
        continuous = include and bool(opts.get("continuous_usage_stats")) and cfg.continuous_usage
        base = {"id": cid, "object": f"{obj}.chunk", "created": int(time.time()), "model": cfg.model}

        def event(choice: dict[str, Any] | None, done_tokens: int) -> bytes:
            ev: dict[str, Any] = {**base, "choices": [choice] if choice is not None else []}
            if continuous:
                ev["usage"] = {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": done_tokens,
                    "total_tokens": n_prompt + done_tokens,
                }
            return _sse(ev)

        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        if chat:
            w.write(
                _chunk(
                    event(
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        },
                        0,
                    )
                )
            )
        sent = j = 0
        while sent < n_out:
            n = min(cfg.tokens_per_chunk[j % len(cfg.tokens_per_chunk)], n_out - sent)
            j += 1
            await asyncio.sleep(max(0.0, due[sent + n - 1] - time.monotonic()))
            text = "".join(token_text(k) for k in range(sent, sent + n))
            sent += n
            choice = (
                {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
                if chat
                else {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
            )
            w.write(_chunk(event(choice, sent)))
            entry["chunks"].append(n)
            entry["writes"].append(time.monotonic())
            await w.drain()
        tail = event(
            {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}
            if chat
            else {"index": 0, "text": "", "logprobs": None, "finish_reason": finish},
            n_out,
        )
        if include:
            tail += _sse({**base, "choices": [], "usage": usage})
        w.write(_chunk(tail + b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def serve(cfg: MockConfig, port: int) -> None:
    mock = VllmMock(cfg)
    srv = await asyncio.start_server(mock.handle, HOST, port, backlog=1024)
    bound = srv.sockets[0].getsockname()
    print(f"http://{bound[0]}:{bound[1]}", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--config", default="{}", help="MockConfig as JSON")
    a = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(MockConfig.from_json(a.config), a.port))


@contextlib.contextmanager
def vllm_mock(cfg: MockConfig | None = None, *, timeout_s: float = 20) -> Iterator[str]:
    """Start the mock in a subprocess (its own interpreter, so it keeps its schedule while the
    client works); yield its URL; stop it on exit."""
    from tests.bench.mock_process import mock_process  # not at the top: this file also runs as a script

    with mock_process(
        __file__, (cfg or MockConfig()).to_json(), url_prefix=f"http://{HOST}:", what="vLLM mock", timeout_s=timeout_s
    ) as url:
        yield url


if __name__ == "__main__":
    main()
