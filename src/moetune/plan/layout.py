"""Layout files: several services sharing the hardware (an orchestrator MoE model and workers).

```yaml
services:
  - name: orchestrator
    model: GLM-5.1-IQ3_KS-00001-of-00008.gguf   # relative to this file
    strategy: auto            # takes what the workers leave
    ctx: 32768
    ctk: q8_0
    ctv: q8_0
    batch: 8192
    ubatch: 8192
  - name: coder1
    model: Qwen3-Coder-Next-Q4_0.gguf
    devices: [CUDA0]
    strategy: all-gpu
    parallel: 2
    ctx: 262144               # 128k per slot
    port: 8081
```
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moetune.errors import InputError
from moetune.model.profile import load_profile
from moetune.plan.plan import ServiceSpec
from moetune.plan.settings import Settings


class _ServiceIn(BaseModel):
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


class _LayoutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    services: list[_ServiceIn] = Field(min_length=1)


def load_layout(path: str | Path, base: Settings, base_port: int = 8080) -> list[ServiceSpec]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such layout file")
    try:
        doc = _LayoutIn.model_validate(yaml.safe_load(p.read_text()))
    except yaml.YAMLError as e:
        raise InputError(f"{p}: not valid YAML ({e})") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError(f"{p}: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
    out = []
    for i, s in enumerate(doc.services):
        model = Path(s.model)
        if not model.is_absolute():
            model = p.parent / model
        settings = replace(base, ctx=s.ctx, slots=s.parallel, batch=s.batch, ubatch=s.ubatch, ctk=s.ctk,
                           ctv=s.ctv, flash_attn=s.flash_attn, amb_mib=s.amb)
        out.append(ServiceSpec(s.name, load_profile(model), settings, s.strategy, s.port or base_port + i,
                               tuple(s.devices) if s.devices else None, s.engine or ""))
    return out
