"""What a single-stream benchmark sends: the reference workloads, custom prompts, context depths.

The two reference workloads are the field report's requests verbatim (reference/000): a short
JSON answer (max_tokens 256) and a long OpenAPI specification (max_tokens 2048), with its sampling
settings and thinking switched through ``chat_template_kwargs``. A depth workload fills the
context with ``depth`` tokens, then measures PP of ``pp_tokens`` and TG of ``max_tokens`` on top,
with token-id prompts so that counts are exact (as llama-bench's ``-d``).

Pure: building request bodies reads no files; :func:`load_prompt_file` is the one reader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from moetune.errors import InputError
from moetune.jsonread import flag, integer, mapping
from moetune.option_defaults import BUILTIN_WORKLOADS

CHAT, DEPTH = "chat", "depth"

SHORT_JSON_PROMPT = (
    "Write a JSON object with 5 fields describing a software project. Include name, language, "
    "version, description, and license."
)
LONG_OPENAPI_PROMPT = (
    "Write a detailed OpenAPI 3.0 specification in JSON for a task management API. Include "
    "endpoints for CRUD operations on projects and tasks, with request/response schemas, error "
    "responses, and authentication via Bearer token."
)
REFERENCE_SAMPLING: dict[str, object] = {"temperature": 0.7, "top_p": 0.95, "top_k": 45, "min_p": 0.01}

# Text whose tokens fill contexts for depth workloads (any valid, non-special tokens will do).
FILLER_TEXT = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches; "
    "pack my box with five dozen liquor jugs, then sphinx of black quartz, judge my vow. "
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    name: str  # unique within a run: short-json, short-json+think, d512, my-prompt
    kind: str  # chat | depth
    max_tokens: int  # tokens to generate (TG length for depth workloads)
    messages: tuple[dict[str, str], ...] = ()
    ignore_eos: bool = False  # exact output length: generate max_tokens whatever the model says
    thinking: bool | None = False  # chat_template_kwargs.enable_thinking; None leaves it to the template
    sampling: dict[str, object] = field(default_factory=lambda: dict(REFERENCE_SAMPLING))
    extra: dict[str, object] = field(default_factory=dict)  # further request fields (from a prompt file)
    depth: int = 0  # depth workloads: tokens already in the context
    pp_tokens: int = 0  # depth workloads: new prompt tokens processed at that depth

    @property
    def tg_depth(self) -> float | None:
        """The mean context of the tokens it generates (speed.decode_context). A chat prompt's length
        is the template's, unknown here: its reply counts (all of it with ignore_eos, else None: the
        reply may stop early, TG is predicted at depth 0)."""
        from moetune.plan.speed import decode_context

        if self.kind == CHAT:
            return decode_context(0, 0, self.max_tokens) if self.ignore_eos else None
        return decode_context(self.depth, self.pp_tokens, self.max_tokens)

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["messages"] = list(self.messages)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Workload:
        """The one reader of a stored workload (:meth:`to_json`)."""
        messages = d.get("messages")
        return cls(
            name=str(d["name"]),
            kind=str(d["kind"]),
            max_tokens=integer(d["max_tokens"]),
            messages=tuple({str(k): str(v) for k, v in mapping(m).items()} for m in messages)
            if isinstance(messages, list | tuple)
            else (),
            ignore_eos=bool(d.get("ignore_eos", False)),
            thinking=flag(d["thinking"]) if "thinking" in d else False,
            sampling=dict(mapping(d["sampling"])) if "sampling" in d else dict(REFERENCE_SAMPLING),
            extra=dict(mapping(d.get("extra"))),
            depth=integer(d.get("depth")),
            pp_tokens=integer(d.get("pp_tokens")),
        )


def builtin(name: str) -> Workload:
    if name == "short-json":
        return Workload(
            name="short-json", kind=CHAT, max_tokens=256, messages=({"role": "user", "content": SHORT_JSON_PROMPT},)
        )
    if name == "long-openapi":
        return Workload(
            name="long-openapi",
            kind=CHAT,
            max_tokens=2048,
            messages=({"role": "user", "content": LONG_OPENAPI_PROMPT},),
        )
    raise InputError(
        f"unknown workload {name!r}", hint=f"choose from {', '.join(BUILTIN_WORKLOADS)}, or give --prompt-file"
    )


def load_prompt_file(path: Path) -> Workload:
    """A custom workload: a text file (the user message), or JSON: a chat request body, as a curl
    ``-d`` holds it (messages, max_tokens, sampling, chat_template_kwargs), or a list of messages."""
    from moetune.paths import readable_file

    try:
        text = readable_file(path, "prompt file").read_text()
    except OSError as e:
        raise InputError(f"--prompt-file {path}: {e.strerror or e}") from None
    name = path.stem
    if path.suffix.lower() != ".json":
        if not text.strip():
            raise InputError(f"--prompt-file {path} is empty")
        return Workload(name=name, kind=CHAT, max_tokens=256, messages=({"role": "user", "content": text},))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"--prompt-file {path}: not valid JSON ({e})") from None
    if isinstance(doc, list):
        doc = {"messages": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list) or not doc["messages"]:
        raise InputError(
            f'--prompt-file {path}: expected a request body with "messages", or a list of messages',
            hint='e.g. {"messages": [{"role": "user", "content": "..."}], "max_tokens": 256}',
        )
    body = dict(doc)
    messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in body.pop("messages"))
    max_tokens = int(body.pop("max_tokens", body.pop("n_predict", 256)))
    ignore_eos = bool(body.pop("ignore_eos", False))
    kwargs = dict(body.pop("chat_template_kwargs", {}) or {})
    thinking = kwargs.pop("enable_thinking", None)
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    for k in ("model", "stream", "stream_options", "cache_prompt"):
        body.pop(k, None)
    sampling = {k: body.pop(k) for k in list(body) if k in ("temperature", "top_p", "top_k", "min_p", "seed")}
    return Workload(
        name=name,
        kind=CHAT,
        max_tokens=max_tokens,
        messages=messages,
        ignore_eos=ignore_eos,
        thinking=None if thinking is None else bool(thinking),
        sampling=sampling,
        extra=body,
    )


def expand(
    names: list[str],
    prompt_files: list[Path],
    *,
    thinking: str | None = None,
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    depths: list[int] | None = None,
    pp_tokens: int = 512,
    tg_tokens: int = 128,
) -> list[Workload]:
    """The workload list of one run, from the CLI's choices.

    ``thinking``: None keeps each workload's own setting (the built-ins: off, as the reference
    requests; prompt files: what their body says), off | on | both set it, template sends none."""
    base: list[Workload] = []
    for n in names:
        base += [builtin("short-json"), builtin("long-openapi")] if n == "reference" else [builtin(n)]
    base += [load_prompt_file(p) for p in prompt_files]
    out: list[Workload] = []
    for w in base:
        if max_tokens is not None:
            w = replace(w, max_tokens=max_tokens)
        if ignore_eos:
            w = replace(w, ignore_eos=True)
        if thinking is None:
            out.append(replace(w, name=w.name + "+think") if w.thinking else w)
            continue
        if thinking == "template":
            out.append(replace(w, thinking=None))
            continue
        if thinking in ("off", "both"):
            out.append(replace(w, thinking=False))
        if thinking in ("on", "both"):
            out.append(replace(w, name=w.name + "+think", thinking=True))
    for d in depths or []:
        if d < 0:
            raise InputError(f"--depth {d}: depths are token counts, 0 or more")
        out.append(
            Workload(
                name=f"d{d}",
                kind=DEPTH,
                max_tokens=tg_tokens,
                ignore_eos=True,
                thinking=None,
                sampling={},
                depth=d,
                pp_tokens=pp_tokens,
            )
        )
    names_seen = [w.name for w in out]
    dup = {n for n in names_seen if names_seen.count(n) > 1}
    if dup:
        raise InputError(f"workload names repeat: {sorted(dup)}", hint="give each prompt file a distinct name")
    if not out:
        raise InputError("no workload chosen", hint="use --workload short-json, --prompt-file FILE or --depth N")
    return out


def chat_body(w: Workload, *, cache_prompt: bool, model: str | None = None) -> dict[str, object]:
    """The /v1/chat/completions request for a chat workload (streamed, usage included: the token
    counts of servers without llama.cpp's ``timings``). ``model``: the name the server lists
    (OpenAI servers other than llama-server refuse a request without it, or with another)."""
    body: dict[str, object] = {
        "messages": list(w.messages),
        "max_tokens": w.max_tokens,
        **w.sampling,
        **w.extra,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": cache_prompt,
    }
    if model is not None:
        body = {"model": model, **body}
    if w.ignore_eos:
        body["ignore_eos"] = True
        body["n_predict"] = w.max_tokens
    if w.thinking is not None:
        kwargs = dict(mapping(body.get("chat_template_kwargs")))
        kwargs["enable_thinking"] = w.thinking
        body["chat_template_kwargs"] = kwargs
    return body


def cycle(ids: list[int], start: int, n: int) -> list[int]:
    if not ids:
        raise ValueError("no token ids to cycle")
    return [ids[(start + i) % len(ids)] for i in range(n)]


def depth_prompts(filler: list[int], depth: int, pp_tokens: int, count: int) -> tuple[list[int], list[list[int]]]:
    """The context fill (``depth`` tokens) and ``count`` blocks of ``pp_tokens`` new tokens.

    The runner sends the fill before every block, which leaves exactly the fill in the slot's cache
    (a fully cached prompt is cut back to itself), so each block is processed on top of ``depth``
    cached tokens: the server's ``cache_n`` and ``prompt_n`` confirm it. Blocks differ from one
    another, as a user's next turn would.
    """
    fill = cycle(filler, 0, depth)
    return fill, [cycle(filler, depth + 1 + 7 * r, pp_tokens) for r in range(count)]


def completion_body(prompt: list[int], n_predict: int, *, cache_prompt: bool = True) -> dict[str, object]:
    """A raw /completion request (token ids in, no template), pinned to slot 0 so its cache is ours."""
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "ignore_eos": True,
        "cache_prompt": cache_prompt,
        "id_slot": 0,
        "stream": True,
        "temperature": 0.0,
    }
