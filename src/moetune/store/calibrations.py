"""Stored speed calibrations: one per (hardware, engine kind), in ``calibrations.json`` in moetune's
data directory. `moetune calibrate` writes them; `moetune plan` reads the one for the hardware and
engine it plans for. ``hardware`` is what a plan records as its hardware: an example's name or the
hardware file's absolute path."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moetune.errors import InputError
from moetune.paths import data_dir


def _file() -> Path:
    return data_dir() / "calibrations.json"


def key(hardware: str | None, engine: str) -> str:
    return f"{hardware or '?'}|{engine}"


def plan_key(plan: Mapping[str, Any]) -> tuple[str | None, str]:
    """(hardware, engine kind) of a plan document: what its calibration is kept under."""
    services = plan.get("services") or [{}]
    return plan.get("hardware"), str((services[0].get("settings") or {}).get("engine", "llama.cpp"))


def load_all() -> dict[str, object]:
    p = _file()
    if not p.exists():
        return {}
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(
            f"{p}: not valid JSON ({e})", hint="fix or delete the file; `moetune calibrate` writes it again"
        ) from None
    return doc if isinstance(doc, dict) else {}


def find(hardware: str | None, engine: str) -> dict[str, object] | None:
    """The stored calibration of (hardware, engine kind), if any (a value that is no JSON object: none)."""
    entry = load_all().get(key(hardware, engine))
    return {str(k): v for k, v in entry.items()} if isinstance(entry, Mapping) else None


def save(hardware: str | None, engine: str, calibration: Mapping[str, object]) -> dict[str, object]:
    doc = load_all()
    entry = {**calibration, "hardware": hardware, "engine": engine, "created_unix": time.time()}
    doc[key(hardware, engine)] = entry
    p = _file()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(p)
    return entry
