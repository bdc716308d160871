"""The server's own options and the user's extra flags: rendered, and checked against the engine.

moetune sets the flags that the ledger, the placement or the speed model depend on from the plan
(``MANAGED``: each with the plan option to use instead); an extra flag that is one of them is
refused, so the command never disagrees with the plan that sized it. Any other flag must be one
the engine build takes (its ``--help``, with what its probes accepted: ``Dialect.flags``); where
the build's help is not known here (an image, an engine not built), extra flags pass unchecked.
Pure: arguments in, arguments out, or an InputError naming the flag and the fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from moetune.engine.dialect import Dialect
from moetune.errors import InputError
from moetune.plan.settings import Settings

_STRATEGY = "--strategy (auto | cpu-moe | all-gpu | n-cpu-moe:N | head-tail:H+T | layers:...)"
_MANAGED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file"), "the MODEL argument"),
    (("-c", "--ctx-size"), "--ctx"),
    (("-np", "--parallel"), "--parallel"),
    (("-b", "--batch-size"), "-b/--batch"),
    (("-ub", "--ubatch-size"), "-ub/--ubatch"),
    (("-ctk", "--cache-type-k"), "--ctk"),
    (("-ctv", "--cache-type-v"), "--ctv"),
    (("-fa", "--flash-attn", "-no-fa", "--no-flash-attn"), "--no-flash-attn"),
    (
        (
            "-ngl",
            "--gpu-layers",
            "--n-gpu-layers",
            "-ot",
            "--override-tensor",
            "-ts",
            "--tensor-split",
            "--cpu-moe",
            "-cmoe",
            "--n-cpu-moe",
            "-ncmoe",
            "-mg",
            "--main-gpu",
            "-fit",
            "--fit",
            "-fitt",
            "--fit-target",
        ),
        _STRATEGY,
    ),
    (("-sm", "--split-mode"), "--split-mode layer|graph (graph: ik_llama.cpp, divided across the GPUs in the ledger)"),
    (("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), "--ctx-checkpoints N (the ledger counts their host memory)"),
    (("-cram", "--cache-ram"), "--cache-ram MIB (the ledger counts the prompt cache's host memory)"),
    (("-dev", "--device"), "the hardware file's devices (a layout service's devices:)"),
    (("--rpc",), "the hardware file's nodes"),
    (("--host", "--port"), "--listen ADDR:PORT"),
    (("--api-key",), "--api-key-file (a key on the command line would be kept in the plan and shown by ps)"),
    (("--api-key-file",), "--api-key-file"),
    (("--reasoning-budget",), "--thinking on|off"),
    (("--temperature",), "--sampling temp=VALUE"),
    (("-amb", "--attention-max-batch"), "--amb"),
    (("-mla", "--mla-use"), "the plan (the MLA mode; tune's --try-mla)"),
    (("-fmoe", "--fused-moe", "-no-fmoe", "--no-fused-moe"), "the plan (tune's --try-fmoe)"),
    (("-nr", "--no-repack", "-rtr", "--run-time-repack", "--repack"), "--repack on|off (tune's --try-repack)"),
    (("--no-mmap", "--mmap", "-lm", "--load-mode"), "--no-mmap"),
    (("-kvu", "--kv-unified"), "the plan"),
    (("--swa-full",), "plan --swa-full"),
    (("--rope-scaling", "--rope-scale", "--yarn-orig-ctx"), "--rope-scaling yarn|linear (the factor follows --ctx)"),
)
_UNMODELED = "nothing: it changes the memory the plan counts, which the ledger does not model; leave it out"
_MANAGED += (
    (
        ("-nkvo", "--no-kv-offload", "--swa-full", "-md", "--model-draft", "-mm", "--mmproj", "-mmu", "--mmproj-url"),
        _UNMODELED,
    ),
)
MANAGED: dict[str, str] = {flag: option for flags, option in _MANAGED for flag in flags}
# extra flags that say what a first-class option says: taken as that option (so the ledger and the
# speed model see them) and rendered in its place. Flag -> (the option, the Settings field, and for
# a flag with a value, how it is read: int, str or float)
_LIFTED: tuple[tuple[tuple[str, ...], str, str, type | None], ...] = (
    (("-t", "--threads"), "-t/--threads", "threads", int),
    (("-tb", "--threads-batch"), "--threads-batch", "threads_batch", int),
    (("-mqkv", "--merge-qkv"), "--merge-qkv", "merge_qkv", None),
    (("-muge", "--merge-up-gate-experts"), "--muge", "merge_up_gate", None),
    (("-ger", "--grouped-expert-routing"), "--ger", "grouped_experts", None),
    (("--warmup-batch",), "--warmup-batch", "server.warmup_batch", None),
    (("-a", "--alias"), "--alias", "server.alias", str),
)
LIFTED = {flag: (option, field, kind) for flags, option, field, kind in _LIFTED for flag in flags}
# --sampling's names and the flag each sets (both engines spell them so)
SAMPLING_FLAGS = {
    "temp": "--temp",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "repeat_penalty": "--repeat-penalty",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
}
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NUMBER.fullmatch(word)


def flag_name(word: str) -> str:
    """``--alias=X`` -> ``--alias``."""
    return word.split("=", 1)[0]


def check_extra(args: Sequence[str], engine: str, d: Dialect) -> None:
    """The user's extra arguments, each flag neither one moetune sets nor one the build lacks."""
    if args and not is_flag(args[0]):
        raise InputError(
            f"--engine-arg {args[0]!r}: the extra arguments start with a flag",
            hint="give the flag first, then its value: --engine-arg=--alias --engine-arg=NAME",
        )
    for word in filter(is_flag, args):
        name = flag_name(word)
        if name in LIFTED or name in SAMPLING_FLAGS.values():
            raise InputError(
                f"--engine-arg {name}: say it with {LIFTED[name][0] if name in LIFTED else '--sampling'}",
                hint="the plan's own option puts it where the ledger and the speed model see it",
            )
        if MANAGED.get(name) == _UNMODELED:
            raise InputError(
                f"--engine-arg {name}: it changes the memory the plan counts, which moetune does not model",
                hint="leave it out: the plan's ledger would not match what the server allocates",
            )
        if name in MANAGED:
            raise InputError(
                f"--engine-arg {name}: moetune sets {name} from the plan; use {MANAGED[name]} instead",
                hint="the plan's options size the memory and the speed that its command must match",
            )
        if d.flags and name not in d.flags:
            raise InputError(
                f"--engine-arg {name}: engine {engine} ({d.version or d.kind}) does not take {name} "
                "(its --help does not list it)",
                hint="check `llama-server --help` of that build, or choose another --engine",
            )


def flag_words(args: Sequence[str]) -> list[tuple[str, ...]]:
    """Each flag of ``args`` with the value after it, if one follows (``--alias X`` -> (--alias, X))."""
    out: list[tuple[str, ...]] = []
    for i, a in enumerate(args):
        if is_flag(a):
            nxt = args[i + 1] if i + 1 < len(args) and not is_flag(args[i + 1]) else None
            out.append((flag_name(a),) if "=" in a or nxt is None else (a, nxt))
    return out


def own_flags(s: Settings) -> list[tuple[str, ...]]:
    """The flags (with a value) this plan's server options and extra arguments may add, to be
    tried on a build whose help does not list them all."""
    o = s.server
    words: list[tuple[str, ...]] = [("-tb", "1")] if s.threads_batch else []
    words += [("--warmup-batch",)] if o.warmup_batch else []
    words += [("--alias", "x")] if o.alias else []
    words += [("--reasoning-budget", "0")] if o.thinking is not None else []
    words += [(SAMPLING_FLAGS[k], "1") for k, _ in o.sampling]
    words += [("--api-key-file", o.api_key_file)] if o.api_key_file else []
    words += [("--rope-scaling", o.rope_scaling), ("--yarn-orig-ctx", "1")] if o.rope_scaling else []
    return words + flag_words(o.extra_args)


def _value(args: Sequence[str], i: int, name: str, option: str, *, kind: type) -> tuple[Any, int]:
    """The value of the flag at ``args[i]`` (``--flag=V`` or ``--flag V``) and the index after it."""
    word = args[i]
    text, nxt = (
        (word.split("=", 1)[1], i + 1)
        if "=" in word
        else ((args[i + 1], i + 2) if i + 1 < len(args) and not is_flag(args[i + 1]) else (None, i + 1))
    )
    try:
        if text is None:
            raise ValueError
        return kind(text), nxt
    except ValueError:
        what = {int: "a whole number", float: "a number"}.get(kind, "a value")
        raise InputError(
            f"--engine-arg {name}: expected {what} after it, got {text!r}", hint=f"or say it with {option}"
        ) from None


def _set(s: Settings, field: str, value: Any, option: str, *, name: str) -> Settings:
    """``s`` with ``field`` (``server.x`` for a server option) set; InputError when the plan's
    option already says another value."""
    server = field.startswith("server.")
    key = field.removeprefix("server.")
    holder: Any = s.server if server else s
    now, default = getattr(holder, key), getattr(type(holder)(), key)
    if now != default and now != value:
        raise InputError(
            f"--engine-arg {name} {value}: the plan already says {option} {now}", hint=f"give it once, as {option}"
        )
    change: dict[str, Any] = {key: value}
    return replace(s, server=replace(s.server, **change)) if server else replace(s, **change)


def lift_extra(s: Settings) -> Settings:
    """``s`` with the extra flags that a first-class option says taken as that option (``LIFTED``,
    the sampling flags, ``--reasoning-budget 0|-1``), so the ledger, the speed model and the plan
    see them; the other extra arguments stay as they are."""
    args, rest, i = s.server.extra_args, [], 0
    sampling = dict(s.server.sampling)
    flag_of = {f: k for k, f in SAMPLING_FLAGS.items()}
    while i < len(args):
        word = args[i]
        name = flag_name(word) if is_flag(word) else ""
        if name in LIFTED:
            option, field, kind = LIFTED[name]
            value, i = (True, i + 1) if kind is None else _value(args, i, name, option, kind=kind)
            if kind is int and value < 1:
                raise InputError(f"--engine-arg {name} {value}: must be at least 1")
            s = _set(s, field, value, option, name=name)
        elif name in flag_of:
            value, i = _value(args, i, name, "--sampling", kind=float)
            if sampling.get(key := flag_of[name], value) != value:
                raise InputError(
                    f"--engine-arg {name} {value:g}: the plan already says --sampling {key}={sampling[key]:g}",
                    hint="give it once, in --sampling",
                )
            sampling[key] = value
        elif name == "--reasoning-budget":
            value, i = _value(args, i, name, "--thinking on|off", kind=int)
            if value not in (0, -1):
                raise InputError(
                    f"--engine-arg --reasoning-budget {value}: moetune plans -1 or 0 (--thinking on|off)",
                    hint="say it with --thinking on|off",
                )
            s = _set(s, "server.thinking", value == -1, "--thinking", name=name)
        else:
            rest.append(word)
            i += 1
    return replace(s, server=replace(s.server, extra_args=tuple(rest), sampling=tuple(sampling.items())))


def parse_sampling(text: str) -> tuple[tuple[str, float], ...]:
    """``temp=0.7,top_k=45`` -> ((temp, 0.7), (top_k, 45.0))."""
    out: list[tuple[str, float]] = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SAMPLING_FLAGS:
            raise InputError(f"--sampling {item!r}: expected NAME=VALUE with NAME one of {', '.join(SAMPLING_FLAGS)}")
        try:
            out.append((key, float(value)))
        except ValueError:
            raise InputError(f"--sampling {item!r}: {value.strip()!r} is not a number") from None
    return tuple(out)


def need_flag(d: Dialect, engine: str, option: str, flag: str) -> None:
    """InputError where the build's help is known and lacks ``flag`` (which ``option`` renders)."""
    if d.flags and flag not in d.flags:
        raise InputError(
            f"{option}: engine {engine} ({d.version or d.kind}) does not take {flag}",
            hint=f"leave {option} out, or choose an engine build that has {flag}",
        )


def rope_factor(ctx_per_slot: int, trained: int) -> float:
    """How far positions are stretched to reach ``ctx_per_slot`` from the ``trained`` context (at least 1)."""
    return max(1.0, round(ctx_per_slot / trained, 2)) if trained else 1.0


def server_options(s: Settings, d: Dialect, engine: str = "", trained_ctx: int = 0) -> list[str]:
    """The first-class server options, in the engine's spelling, then the user's extra arguments;
    InputError for one the engine build does not take. ``trained_ctx``: the model's
    ``context_length``, which rope scaling stretches to the context per slot."""
    engine = engine or str(d.kind)
    o = s.server
    argv: list[str] = []

    def add(option: str, *words: str) -> None:
        need_flag(d, engine, option, words[0])
        argv.extend(words)

    if s.threads_batch:
        add("--threads-batch", "-tb", str(s.threads_batch))
    for option, on, words in (
        ("--merge-qkv", s.merge_qkv, d.merge_qkv),
        ("--ger", s.grouped_experts, d.grouped_experts),
        ("--muge", s.merge_up_gate, d.merge_up_gate),
    ):
        if on and not words:
            raise InputError(
                f"{option}: engine {engine} ({d.version or d.kind}) has no such option",
                hint="it is an ik_llama.cpp option: plan with --engine ik_llama.cpp, or leave it out",
            )
        if on and option != "--muge":  # -muge: rendered with ik_llama.cpp's other options (render.ik_flags)
            add(option, *words)
    if o.warmup_batch:
        add("--warmup-batch", "--warmup-batch")
    if o.alias:
        add("--alias", "--alias", o.alias)
    if o.thinking is not None:
        if not d.flags or "--reasoning-budget" in d.flags:
            add("--thinking", "--reasoning-budget", "-1" if o.thinking else "0")
        else:
            add("--thinking", "--chat-template-kwargs", json.dumps({"enable_thinking": o.thinking}))
    for key, value in o.sampling:
        add("--sampling", SAMPLING_FLAGS[key], f"{value:g}")
    if o.rope_scaling:
        scale = f"{rope_factor(s.ctx // s.slots, trained_ctx):g}"
        add("--rope-scaling", *("--rope-scaling", o.rope_scaling, "--rope-scale", scale))
        if trained_ctx:
            add("--rope-scaling", "--yarn-orig-ctx", str(trained_ctx))
    if o.api_key_file:
        add("--api-key-file", "--api-key-file", o.api_key_file)
    check_extra(o.extra_args, engine, d)
    return argv + list(o.extra_args)
