"""Probe this machine: GPUs through nvidia-smi (NVML), RAM from /proc/meminfo, cores from lscpu,
RAM bandwidth measured with a large copy (or estimated when --no-measure).

nvidia-smi's answers are read by a pure function (``parse_gpus``) that never fails: a field it
cannot read (``[N/A]``, ``[Not Supported]``, missing, not a number) becomes a note and a default.
A GPU that reports no memory of its own while sharing the host's (a DGX Spark's GB10, whose
nvidia-smi says ``[N/A]``) is one device holding the unified memory less the CPU's share, and the
CPU keeps that share, as ``examples/dgx-spark-x2.yaml`` describes the same machine. A discrete GPU
whose size nvidia-smi cannot give is left out, with a note: the file written is always valid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from moetune.hardware.inventory import DEFAULT_PCIE_GBS, Device, Inventory, Node
from moetune.kinds import DeviceKind

# Memory bandwidth (GB/s) by GPU name, for what NVML does not report.
GPU_BANDWIDTH = {
    "H200": 4800,
    "H100 NVL": 3900,
    "H100": 3350,
    "A100": 2039,
    "L40S": 864,
    "RTX PRO 6000": 1790,
    "RTX 6000 Ada": 960,
    "RTX 5090": 1792,
    "RTX 4090": 1008,
    "RTX 3090": 936,
    "GB10": 273,
    "A6000": 768,
}
UNKNOWN_BANDWIDTH_GBS = 500.0
# GPUs that share the host's memory (no memory.total of their own) and their CPU-GPU link (GB/s):
# the GB10's NVLink-C2C
UNIFIED_LINK_GBS = {"GB10": 200.0}
UNIFIED_CPU_SHARE = 1 / 8  # of the unified memory, kept for the OS and the CPU's buffers (16 GiB of 128)
QUERY = ("index", "name", "memory.total", "pcie.link.gen.max", "pcie.link.width.max")
PCIE_GBS_PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True, slots=True)
class ProbedGpus:
    devices: tuple[Device, ...]
    unified: bool = False  # a device shares the host's memory: the CPU keeps cpu_share of it
    notes: tuple[str, ...] = ()  # what could not be read, and what was assumed instead


def _number(text: str) -> float | None:
    """A non-negative number, with or without the unit nvidia-smi adds when ``nounits`` is not
    honoured (``97887 MiB``); None for ``[N/A]``, ``[Not Supported]``, empty or anything else."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)\s*(?:MiB)?", text.strip())
    return float(m[1]) if m else None


def _unavailable(text: str) -> bool:
    """nvidia-smi's own word that a field has no value on this device (not a missing column)."""
    return text.strip().lower() in ("[n/a]", "[not supported]", "n/a", "not supported")


def parse_gpus(text: str, ram_mib: float) -> ProbedGpus:
    """The GPUs in ``nvidia-smi --query-gpu=index,name,memory.total,pcie.link.gen.max,pcie.link.width.max
    --format=csv,noheader,nounits``'s output; ``ram_mib`` is the host's memory (MemTotal), which a
    unified-memory GPU shares. Never raises: unreadable lines and fields are notes.

    A GPU without a memory size of its own shares the host's when it is one moetune knows to
    (``UNIFIED_LINK_GBS``: the GB10), or when nvidia-smi says it has neither memory nor a PCIe link
    (an integrated GPU); the unified GPUs then split the host's memory less the CPU's share, so that
    no MiB is counted twice. Any other GPU whose size is unknown is left out (a device of 0 MiB is
    not a valid hardware file), with a note saying how to add it."""
    rows: list[tuple[str, str, dict[str, str]]] = []
    notes: list[str] = []
    for line in text.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 2 or not re.fullmatch(r"\d+", parts[0]):
            if line.strip():
                notes.append(f"nvidia-smi: skipped a line that names no GPU: {line.strip()[:120]!r}")
            continue
        if any(r[0] == parts[0] for r in rows):
            notes.append(
                f"nvidia-smi: GPU index {parts[0]} listed twice; the second line skipped: {line.strip()[:120]!r}"
            )
            continue
        rows.append(
            (
                parts[0],
                parts[1] or "unknown GPU",
                dict(zip(QUERY, parts + [""] * (len(QUERY) - len(parts)), strict=False)),
            )
        )

    def shares_host(name: str, f: dict[str, str]) -> bool:
        if _number(f["memory.total"]):
            return False
        return any(k in name for k in UNIFIED_LINK_GBS) or (
            _unavailable(f["memory.total"]) and _unavailable(f["pcie.link.gen.max"])
        )

    n_unified = sum(shares_host(name, f) for _, name, f in rows)
    devs: list[Device] = []
    for idx, name, f in rows:
        bw = next((float(v) for k, v in GPU_BANDWIDTH.items() if k in name), None)
        if bw is None:
            bw = UNKNOWN_BANDWIDTH_GBS
            notes.append(f"CUDA{idx} ({name}): memory bandwidth unknown, {bw:g} GB/s assumed (set bw_gbs)")
        mem = _number(f["memory.total"]) or None
        link = DEFAULT_PCIE_GBS
        shared = next((v for k, v in UNIFIED_LINK_GBS.items() if k in name), None)
        if mem is None and shares_host(name, f):
            mem = ram_mib * (1 - UNIFIED_CPU_SHARE) / n_unified
            link = shared or link
            notes.append(
                f"CUDA{idx} ({name}) shares the host's {ram_mib:,.0f} MiB (unified memory): "
                f"{mem:,.0f} MiB given to the GPU, the rest kept for the CPU (RAM and GPU "
                "memory are the same memory: the file counts it once)"
            )
        elif mem is None:
            notes.append(
                f"CUDA{idx} ({name}): nvidia-smi reports no memory size "
                f"({f['memory.total'] or 'missing'}); left out of the file (add it under devices "
                f"with its mem_mib: {{name: CUDA{idx}, kind: gpu, mem_mib: ..., bw_gbs: {bw:g}}})"
            )
            continue
        gen, width = _number(f["pcie.link.gen.max"]), _number(f["pcie.link.width.max"])
        if shared is None and gen is not None and width is not None and int(gen) in PCIE_GBS_PER_LANE:
            link = round(PCIE_GBS_PER_LANE[int(gen)] * int(width) * 0.8, 1)
        elif shared is None:
            notes.append(f"CUDA{idx} ({name}): PCIe link not reported, {link:g} GB/s assumed (set link_gbs)")
        devs.append(
            Device(name=f"CUDA{idx}", kind=DeviceKind.GPU, mem_mib=round(mem), bw_gbs=bw, node="local", link_gbs=link)
        )
    return ProbedGpus(tuple(devs), n_unified > 0, tuple(notes))


def local_node(
    gpus: ProbedGpus, ram_mib: float, cores: int, ram_bw_gbs: float, *, cpu_isa: tuple[str, ...] | None = None
) -> Node:
    """This machine as a node: where a GPU shares the host's memory, the CPU keeps only its share."""
    cpu_ram = ram_mib * UNIFIED_CPU_SHARE if gpus.unified else ram_mib
    return Node(
        name="local", cores=cores, ram_mib=round(cpu_ram), ram_bw_gbs=ram_bw_gbs, devices=gpus.devices, cpu_isa=cpu_isa
    )


# /proc/cpuinfo's flags (x86 "flags", Arm "Features") -> the words of the hardware file's cpu.isa
_ISA_FLAGS = (
    ("avx2", ("avx2",)),
    ("avx512", ("avx512f",)),
    ("amx", ("amx_int8", "avx512_vnni")),
    ("dotprod", ("asimddp",)),
    ("i8mm", ("i8mm",)),
)


def parse_isa(cpuinfo: str) -> tuple[str, ...] | None:
    """The vector extensions the engine's repacked kernels use, from /proc/cpuinfo (None: no flags line)."""
    line = next((x for x in cpuinfo.splitlines() if x.split(":")[0].strip() in ("flags", "Features")), None)
    if line is None:
        return None
    flags = set(line.split(":", 1)[1].split())
    return tuple(word for word, need in _ISA_FLAGS if all(f in flags for f in need))


def _cores() -> int:
    try:
        out = subprocess.run(["lscpu", "-p=CORE"], capture_output=True, text=True, timeout=10).stdout
        cores = {line for line in out.splitlines() if line and not line.startswith("#")}
        if cores:
            return len(cores)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return os.cpu_count() or 1


def _ram_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure_ram_bw_gbs(size_mib: int = 256, repeats: int = 3) -> float:
    """Copy bandwidth of one large buffer (read + write counted), best of a few runs."""
    import numpy as np

    src = np.ones(size_mib << 18, dtype=np.float32)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        dt = time.perf_counter() - t0
        best = max(best, 2 * src.nbytes / dt / 1e9)
    return round(best, 1)


def _nvidia_smi() -> tuple[str, str | None]:
    """(its output, why it gave none) — ("", None) where there is no nvidia-smi at all."""
    if not shutil.which("nvidia-smi"):
        return "", None
    try:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", f"nvidia-smi did not answer ({e}); no GPU described"
    if r.returncode != 0:
        # a GPU in trouble fails the command while the others are still listed: keep those
        rows = "".join(x for x in r.stdout.splitlines(keepends=True) if re.match(r"\s*\d+\s*,", x))
        said = [x for x in (r.stdout + "\n" + r.stderr).splitlines() if x.strip() and x not in rows]
        return rows, (
            f"nvidia-smi failed (exit {r.returncode}): {(said or ['no message'])[0].strip()[:160]}; "
            + ("only the GPUs it listed described" if rows else "no GPU described")
        )
    return r.stdout, None


def probe(measure: bool = True, notes: list[str] | None = None) -> Inventory:
    """This machine as an inventory; what could not be read is appended to ``notes``."""
    ram = _ram_mib()
    text, failed = _nvidia_smi()
    gpus = parse_gpus(text, ram)
    if notes is not None:
        notes += [failed] if failed else []
        notes += gpus.notes
    bw = measure_ram_bw_gbs() if measure else 20.0 * _cores()
    try:
        isa = parse_isa(Path("/proc/cpuinfo").read_text())
    except OSError:
        isa = None
    return Inventory((local_node(gpus, ram, _cores(), bw, cpu_isa=isa),), name=os.uname().nodename)
