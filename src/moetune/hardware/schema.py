"""The hardware file's accepted form, validated with pydantic at the boundary.

:func:`moetune.hardware.inventory.from_dict` turns it into the planner's frozen dataclasses; this
module is imported only when a file is read.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from moetune.hardware import CPU_SPEED_KEYS, DEFAULT_RPC_PORT


class DeviceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a number, not .inf or .nan
    name: str
    kind: Literal["gpu", "cpu", "rpc"] = "gpu"
    mem_mib: float = Field(gt=0)
    bw_gbs: float = Field(gt=0)
    link_gbs: float | None = Field(default=None, gt=0)  # to the host (PCIe) or over the network (RPC)
    reserved_mib: float = Field(default=0, ge=0)  # used by other processes (desktop, other services)
    tflops: float | None = Field(default=None, gt=0)


class CpuIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a number, not .inf or .nan
    cores: int = Field(gt=0)
    ram_mib: float = Field(gt=0)
    ram_bw_gbs: float = Field(gt=0)
    reserved_mib: float = Field(default=0, ge=0)  # left for the OS and other programs
    name: str | None = None
    # vector extensions the engine's repacked kernels use (plan.repack); absent: AVX2 assumed
    isa: list[Literal["avx2", "avx512", "amx", "dotprod", "i8mm"]] | None = None
    # the speed model's constants measured on this CPU (`moetune hw attention` writes them)
    speed: dict[str, float] | None = None

    @field_validator("speed")
    @classmethod
    def _speed(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k, x in (v or {}).items():
            if k not in CPU_SPEED_KEYS:
                raise ValueError(f"cpu.speed: {k!r} is not one a CPU can carry (known: {', '.join(CPU_SPEED_KEYS)})")
            if not x > 0:
                raise ValueError(f"cpu.speed.{k}: {x} must be positive")
        return v


class NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a number, not .inf or .nan
    name: str
    cpu: CpuIn
    devices: list[DeviceIn] = []
    ssh: str | None = None
    link_addr: str | None = None
    rpc_port: int = Field(default=DEFAULT_RPC_PORT, gt=0, lt=65536)
    link_gbs: float | None = Field(default=None, gt=0)
    bin_dir: str | None = None
    allow_public_bind: bool = False  # let the worker listen on 0.0.0.0 or a public address (warned about)
    rdma: bool = False  # the link to this node also carries RDMA (RoCE): tune may try --transport rdma

    @field_validator("ssh")
    @classmethod
    def _ssh(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError(f"ssh {v!r} is not an ssh destination (user@host or a Host of your ssh config)")
        return v

    @field_validator("link_addr")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"link_addr {v!r} is not an IP address") from None
        return v


class HardwareIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a number, not .inf or .nan
    nodes: list[NodeIn] = Field(min_length=1)
    name: str | None = None
