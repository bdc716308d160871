"""`serve-bench LAYOUT_PLAN --load SERVICE=SPEC`: one service's workload, parsed in one place.

A SPEC is ``KEY:VALUE`` pairs separated by commas, the keys serve-bench's own options without
their dashes (a flag alone turns it on)::

    main=concurrency:1,requests:8,input-len:512,output-len:64
    worker0=c:4,duration:30,prompt:256,output:128        # c, prompt and output are short names
    coder=dataset:sharegpt.json,concurrency:2
    agent=sessions:2,turns:4,turn-tokens:256,strip-thinking
    editor=replay:session.jsonl,speed:max

One service, one load level (one concurrency, or the sessions, or the replay). The options given
to serve-bench itself are every service's defaults (``--output-len 32 --load a=c:1 --load b=c:4``);
a SPEC's keys override them. What is wrong is an :class:`~moetune.errors.InputError` that names the
service and the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moetune.bench.serve.run import ServeBenchSpec
from moetune.bench.serve.sessions import SessionSpec
from moetune.errors import InputError
from moetune.option_defaults import ARRIVALS

SYNTHETIC, DATASET, SESSIONS, REPLAY = "synthetic", "dataset", "sessions", "replay"
ON_OFF = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}


def _int(lo: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        n = int(v)
        if n < lo:
            raise ValueError(f"at least {lo}")
        return n

    parse.__doc__ = f"an integer, at least {lo}"
    return parse


def _float(lo: float, open_: bool = False) -> Callable[[str], float]:
    def parse(v: str) -> float:
        x = float(v)
        if x < lo or (open_ and x == lo):
            raise ValueError("too small")
        return x

    parse.__doc__ = f"a number {'above' if open_ else 'at least'} {lo:g}"
    return parse


def _flag(v: str) -> bool:
    """on or off"""
    if v.lower() not in ON_OFF:
        raise ValueError("not on/off")
    return ON_OFF[v.lower()]


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError("not a choice")
        return v

    parse.__doc__ = " or ".join(options)
    return parse


def _file(v: str) -> Path:
    """an existing file"""
    p = Path(v).expanduser()
    if not p.is_file():
        raise ValueError("no such file")
    return p


def _text(v: str) -> str:
    """a name"""
    if not v:
        raise ValueError("empty")
    return v


def _speed(v: str) -> str:
    """max, or a factor such as 1x, 2x, 0.5x"""
    from moetune.bench.record.schedule import parse_speed

    try:
        parse_speed(v)
    except InputError:
        raise ValueError("not a speed") from None
    return v


# key -> how its value is read; the keys are serve-bench's option names (a dash for each underscore)
KEYS: dict[str, Callable[[str], Any]] = {
    "concurrency": _int(1),
    "rate": _float(0, True),
    "arrivals": _choice(*ARRIVALS),
    "requests": _int(1),
    "duration": _float(0, True),
    "input-len": _int(1),
    "output-len": _int(1),
    "dataset": _file,
    "tokenizer": _file,
    "warmup": _int(0),
    "seed": _int(-(2**31)),
    "prefix-cache": _flag,
    "thinking": _choice("on", "off", "default"),
    "timeout": _float(1),
    "model": _text,
    "replay": _file,
    "speed": _speed,
    "sessions": _int(1),
    "turns": _int(1),
    "system-tokens": _int(16),
    "turn-tokens": _int(1),
    "think-time": _float(0),
    "strip-thinking": _flag,
}
ALIASES = {"c": "concurrency", "prompt": "input-len", "output": "output-len"}
FLAGS = ("prefix-cache", "strip-thinking")  # a key alone turns these on
LEVEL_KEYS = ("concurrency", "rate", "arrivals", "requests", "duration", "input-len", "dataset", "prefix-cache")
SESSION_KEYS = ("turns", "system-tokens", "turn-tokens", "think-time", "strip-thinking")
NOT_WITH_REPLAY = (
    "rate",
    "arrivals",
    "dataset",
    "input-len",
    "output-len",
    "requests",
    "duration",
    "warmup",
    "seed",
    "prefix-cache",
    "thinking",
    "tokenizer",
    *SESSION_KEYS,
    "sessions",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceLoad:
    """One service's workload under the shared load: ``spec`` (one concurrency level, or its
    sessions), or the session file ``replay`` sent at ``speed``."""

    service: str
    spec: ServeBenchSpec
    replay: Path | None = None
    speed: str = "1x"
    keys: tuple[str, ...] = ()  # the SPEC's own keys, as given

    @property
    def kind(self) -> str:
        if self.replay is not None:
            return REPLAY
        if self.spec.sessions is not None:
            return SESSIONS
        return DATASET if self.spec.dataset is not None else SYNTHETIC

    @property
    def concurrency(self) -> int:
        """Its streams: the concurrency, the sessions, or the replay's client slots (0: as recorded)."""
        if self.spec.sessions is not None:
            return self.spec.sessions.sessions
        if self.replay is not None and "concurrency" not in self.keys:
            return 0
        return self.spec.concurrency[0]

    def describe(self) -> str:
        s = self.spec
        if self.replay is not None:
            c = f", up to {self.concurrency} in flight" if self.concurrency else ""
            return f"replay of {self.replay.name} at {self.speed}{c}"
        if s.sessions is not None:
            ss = s.sessions
            return (
                f"{ss.sessions} sessions x {ss.turns} turns ({ss.system_tokens} system + {ss.turn_tokens} per "
                f"turn + {ss.output_len} reply tokens)"
            )
        n = s.level_requests(s.concurrency[0])
        size = f"{s.dataset.name}" if s.dataset is not None else f"{s.input_len} prompt tokens"
        out = f"{s.output_len or 64} output" if s.dataset is None or s.output_len else "the replies' lengths"
        how = f"{n} requests" if s.duration_s is None else f"{s.duration_s:g} s"
        rate = f" at {s.rate:g}/s" if s.rate else ""
        return f"c={s.concurrency[0]}{rate}, {how} of {size} -> {out}"

    def to_json(self) -> dict[str, object]:
        from dataclasses import asdict

        w = {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in asdict(self.spec).items()
            if k not in ("url", "label", "slo")
        }
        return {
            "service": self.service,
            "kind": self.kind,
            "describe": self.describe(),
            "replay": None if self.replay is None else str(self.replay.resolve()),
            "speed": self.speed,
            "workload": w,
        }


def split_load(text: str) -> tuple[str, str]:
    """``SERVICE=SPEC`` -> (service, spec)."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InputError(
            f"--load {text!r}: give SERVICE=SPEC, e.g. main=concurrency:1,requests:8",
            hint="SERVICE is a server of the layout plan (`moetune plan --layout` names them)",
        )
    return name, spec.strip()


def parse_spec(service: str, text: str) -> dict[str, object]:
    """A SPEC's pairs, each value read and checked: {option key: value}."""
    out: dict[str, object] = {}
    where = f"--load {service}="
    if not text:
        raise InputError(f"{where}: the SPEC is empty", hint="e.g. concurrency:1,requests:8,input-len:128")
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        raw_key, sep, value = part.partition(":")
        key = ALIASES.get(raw_key.strip(), raw_key.strip())
        if key not in KEYS:
            known = ", ".join([*KEYS, *ALIASES])
            raise InputError(f"{where}{text}: unknown key {raw_key.strip()!r}", hint=f"keys: {known}")
        if key in out:
            raise InputError(f"{where}{text}: {key!r} is given twice", hint="give each key once")
        if not sep:
            if key not in FLAGS:
                raise InputError(f"{where}{text}: {key!r} needs a value ({key}:VALUE, {KEYS[key].__doc__})")
            value = "on"
        value = value.strip()
        try:
            out[key] = KEYS[key](value)
        except ValueError:
            raise InputError(f"{where}{text}: {key}:{value} is not {KEYS[key].__doc__}") from None
    return out


def service_load(service: str, keys: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> ServiceLoad:
    """One service's workload from its SPEC's ``keys`` over ``defaults`` (the options serve-bench
    was given, by the same keys); combinations that make no sense are input errors."""
    where = f"--load {service}"
    k = {**(defaults or {}), **keys}
    given = set(keys)

    def clash(a: str, b: str) -> None:
        if a in k and b in k:
            raise InputError(f"{where}: {a} and {b} do not go together", hint=f"drop {b if b in given else a}")

    if "replay" in k:
        bad = [x for x in NOT_WITH_REPLAY if x in given]
        if bad:
            raise InputError(
                f"{where}: a replay sends the recorded requests as they are: drop {', '.join(bad)}",
                hint="speed paces the replay, concurrency bounds the requests in flight",
            )
    elif "speed" in given:
        raise InputError(f"{where}: speed paces a replay", hint="add replay:FILE, or drop speed")
    if "sessions" in k and "replay" not in k:
        bad = [x for x in LEVEL_KEYS if x in given]
        if bad:
            raise InputError(
                f"{where}: sessions run conversations, not load levels: {', '.join(bad)} do not apply",
                hint="the sessions are the concurrency; their sizes are system-tokens, turn-tokens and output-len",
            )
    elif "sessions" not in k:
        bad = [x for x in SESSION_KEYS if x in given]
        if bad:
            raise InputError(f"{where}: {', '.join(bad)} shape agent sessions", hint="add sessions:N")
    if "replay" not in k:
        clash("dataset", "input-len")
        clash("requests", "duration")
    if k.get("strip-thinking") and k.get("thinking") == "off":
        raise InputError(
            f"{where}: strip-thinking removes the reasoning, and with thinking:off the replies have none",
            hint="drop one of them",
        )
    sessions = None
    if "sessions" in k and "replay" not in k:
        sessions = SessionSpec(
            sessions=k["sessions"],
            turns=k.get("turns", 4),
            system_tokens=k.get("system-tokens", 512),
            turn_tokens=k.get("turn-tokens", 128),
            output_len=k.get("output-len", 64),
            think_time_s=k.get("think-time", 0.0),
            strip_thinking=bool(k.get("strip-thinking")),
        )
    spec = ServeBenchSpec(
        url="",
        concurrency=(k.get("concurrency", 1),),
        rate=k.get("rate"),
        arrivals=k.get("arrivals", "poisson"),
        dataset=k.get("dataset"),
        input_len=k.get("input-len", 128),
        output_len=k.get("output-len"),
        requests=k.get("requests"),
        duration_s=k.get("duration"),
        warmup=k.get("warmup", 2),
        seed=k.get("seed", 0),
        prefix_cache=bool(k.get("prefix-cache", False)),
        thinking={"on": True, "off": False}.get(k.get("thinking", "default")),
        timeout_s=k.get("timeout", 600),
        model=k.get("model"),
        sessions=sessions,
        tokenizer=k.get("tokenizer"),
    )
    return ServiceLoad(service=service, spec=spec, replay=k.get("replay"), speed=k.get("speed", "1x"), keys=tuple(keys))


def parse_loads(texts: tuple[str, ...] | list[str], defaults: Mapping[str, Any] | None = None) -> list[ServiceLoad]:
    """Every ``--load SERVICE=SPEC``, each service once."""
    out: list[ServiceLoad] = []
    for t in texts:
        name, spec = split_load(t)
        if any(s.service == name for s in out):
            raise InputError(f"--load {name}= is given twice", hint="give each service one --load")
        out.append(service_load(name, parse_spec(name, spec), defaults))
    return out


def with_slo(loads: list[ServiceLoad], slo: dict[str, float] | None) -> list[ServiceLoad]:
    """Every service judged by the same latency targets (goodput per level)."""
    return [replace(s, spec=replace(s.spec, slo=slo)) for s in loads]
