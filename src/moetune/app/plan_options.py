"""The options of a plan (`moetune plan`, `moetune tune`; the click decorator is
``moetune.cli.common.plan_options``, which gives their defaults) read into the planner's
:class:`~moetune.plan.settings.Settings`, the server's port and what is left to the speed model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.errors import InputError

if TYPE_CHECKING:
    from moetune.plan.attention import Choose
    from moetune.plan.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOptions:
    """The values as the command line gives them (the field names are the options')."""

    ctx: int
    parallel: int
    batch: int
    ubatch: int
    ctk: str | None
    ctv: str | None
    flash_attn: str  # on | off | auto
    no_flash_attn: bool
    repack: str  # auto | on | off
    no_mmap: bool
    amb: int
    threads: int | None
    threads_batch: int | None
    merge_qkv: bool
    muge: bool
    ger: bool
    warmup_batch: bool
    alias: str | None
    thinking: str | None  # on | off | None (the engine's)
    sampling: str | None  # NAME=VALUE,...
    rope_scaling: str | None
    ctx_checkpoints: int | None
    cache_ram: int | None
    split_mode: str
    engine_args: tuple[str, ...]
    listen: str | None  # ADDR[:PORT]
    api_key_file: Path | None

    def flash_attn_given(self) -> bool | None:
        """--flash-attn / --no-flash-attn as the user gave them: on, off, or None (left to the plan)."""
        if self.no_flash_attn:
            if self.flash_attn == "on":
                raise InputError("--flash-attn on and --no-flash-attn contradict", hint="give one of them")
            return False
        return None if self.flash_attn == "auto" else self.flash_attn == "on"

    def choose(self) -> Choose:
        """What of flash attention and the cache type the user left to the plan."""
        from moetune.plan.attention import Choose

        return Choose(flash_attn=self.flash_attn_given() is None, cache=self.ctk is None and self.ctv is None)

    def port(self, port: int) -> int:
        """The server's port: --listen's when it names one, else ``port`` (--port)."""
        return parse_listen(self.listen)[1] or port

    def settings(self) -> Settings:
        """The settings these values say (a cache type not given is f16, flash attention on)."""
        from moetune.engine.server_args import lift_extra, parse_sampling
        from moetune.plan.settings import REPACK_CHOICES, ServerOptions, Settings

        host, _ = parse_listen(self.listen)
        key = None
        if self.api_key_file is not None:
            from moetune.paths import readable_file

            key = str(readable_file(self.api_key_file, "API key file").resolve())
        server = ServerOptions(
            host=host,
            api_key_file=key,
            alias=self.alias,
            thinking=None if self.thinking is None else self.thinking == "on",
            sampling=parse_sampling(self.sampling or ""),
            warmup_batch=self.warmup_batch,
            extra_args=tuple(self.engine_args),
            rope_scaling=self.rope_scaling,
        )
        fa = self.flash_attn_given()
        settings = Settings(
            ctx=self.ctx,
            slots=self.parallel,
            batch=self.batch,
            ubatch=self.ubatch,
            ctk=self.ctk or "f16",
            ctv=self.ctv or "f16",
            flash_attn=True if fa is None else fa,
            mmap=not self.no_mmap,
            repack=REPACK_CHOICES[self.repack],
            amb_mib=self.amb,
            threads=self.threads,
            threads_batch=self.threads_batch,
            merge_qkv=self.merge_qkv,
            merge_up_gate=self.muge,
            grouped_experts=self.ger,
            ctx_checkpoints=self.ctx_checkpoints,
            split_mode=self.split_mode,
            cache_ram_mib=self.cache_ram,
            server=server,
        )
        return lift_extra(settings)  # --engine-arg=--alias X: the same as --alias X


def parse_listen(listen: str | None) -> tuple[str, int | None]:
    """``--listen ADDR[:PORT]`` as (address, port or None); no --listen is loopback."""
    from moetune.plan.settings import LOOPBACK

    if listen is None:
        return LOOPBACK, None
    text = listen.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?|([0-9A-Fa-f:]+)", text)
    if m is None:
        raise InputError(
            f"--listen {listen!r}: expected ADDR or ADDR:PORT ([ADDR]:PORT for IPv6)",
            hint="--listen 0.0.0.0:8000, --listen 127.0.0.1",
        )
    host = m[1] or m[3] or m[5]
    port = m[2] or m[4]
    if ":" in host:
        import ipaddress

        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InputError(
                f"--listen {listen!r}: {host} is not an IPv6 address",
                hint="write an IPv6 address with a port as [ADDR]:PORT",
            ) from None
    if port is not None and not 0 < int(port) < 65536:
        raise InputError(f"--listen {listen!r}: port {port} is not between 1 and 65535")
    return host, None if port is None else int(port)
