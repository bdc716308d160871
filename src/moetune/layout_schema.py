"""The layout file's schema (``moetune plan --layout``), checked with pydantic: imported only when a
layout file is read, so a plan of one model does not pay for pydantic and yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from moetune import yamlfile
from moetune.errors import InputError


class ServiceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    model: str
    strategy: str = "auto"
    ctx: int = Field(default=4096, gt=0)
    parallel: int = Field(default=1, gt=0)
    batch: int = Field(default=2048, gt=0)
    ubatch: int = Field(default=512, gt=0)
    ctk: Literal["f16", "q8_0", "q4_0"] = "f16"
    ctv: Literal["f16", "q8_0", "q4_0"] = "f16"
    flash_attn: bool = True
    devices: list[str] | None = None
    port: int | None = Field(default=None, gt=0, lt=65536)
    engine: str | None = None
    amb: int = 0
    threads: int | None = Field(default=None, gt=0)
    threads_batch: int | None = Field(default=None, gt=0)
    ctx_checkpoints: int | None = Field(default=None, ge=0)  # --ctx-checkpoints (None: the plan's, else the engine's)
    split_mode: Literal["layer", "graph"] | None = None  # --split-mode (None: the plan's)
    cache_ram: int | None = Field(default=None, ge=-1)  # --cache-ram MiB (None: the plan's)
    args: list[str] = Field(default_factory=list)  # extra llama-server arguments, checked like --engine-arg
    # the server's environment, besides moetune's own
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_leaves_devices(cls, env: dict[str, str]) -> dict[str, str]:
        for k in env:
            if k.endswith("_VISIBLE_DEVICES") or k.startswith("MOETUNE_"):
                raise ValueError(
                    f"{k} is set by moetune (the service's devices: and the hardware file decide which GPUs it sees)"
                )
        return env


class LayoutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    services: list[ServiceIn] = Field(min_length=1)


def read_layout(p: Path) -> LayoutIn:
    from moetune.paths import readable_file

    readable_file(p, "layout file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read the layout file ({e.strerror})") from None
    try:
        return LayoutIn.model_validate(yamlfile.parse(data, str(p)))
    except ValidationError as e:
        raise yamlfile.schema_error(str(p), e) from None
