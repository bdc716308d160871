"""GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``), when it and a driver
are present; nothing otherwise. :class:`NvmlProbe` takes the module as a parameter so that tests
without a GPU give it a stand-in (tests/monitor/test_gpu.py says so).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from moetune.monitor.snapshot import GpuSample


def load_nvml() -> ModuleType | None:
    """The initialised NVML module, or None (no package, no driver, no GPU)."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    mod: ModuleType = pynvml
    return mod


class NvmlProbe:
    """Reads every GPU NVML sees; a reading NVML refuses (power on some boards) is None."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.names = [self._name(h) for h in self.handles]

    def _name(self, h: Any) -> str:
        name = self.nvml.nvmlDeviceGetName(h)
        return name.decode() if isinstance(name, bytes) else str(name)

    def _try(self, f: Any, *args: Any) -> Any:
        try:
            return f(*args)
        except Exception:
            return None

    def sample(self) -> tuple[GpuSample, ...]:
        n = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            util = self._try(n.nvmlDeviceGetUtilizationRates, h)
            mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
            power_mw = self._try(n.nvmlDeviceGetPowerUsage, h)
            rx = self._try(n.nvmlDeviceGetPcieThroughput, h, getattr(n, "NVML_PCIE_UTIL_RX_BYTES", 1))
            tx = self._try(n.nvmlDeviceGetPcieThroughput, h, getattr(n, "NVML_PCIE_UTIL_TX_BYTES", 0))
            out.append(
                GpuSample(
                    index=i,
                    name=self.names[i],
                    util_pct=None if util is None else float(util.gpu),
                    mem_used_bytes=None if mem is None else int(mem.used),
                    mem_total_bytes=None if mem is None else int(mem.total),
                    power_w=None if power_mw is None else power_mw / 1000.0,
                    pcie_rx_bytes_per_s=None if rx is None else rx * 1024.0,  # NVML gives KB/s
                    pcie_tx_bytes_per_s=None if tx is None else tx * 1024.0,
                )
            )
        return tuple(out)

    def process_memory(self) -> dict[int, int]:
        """GPU memory per pid, summed over GPUs (compute processes; empty where NVML will not say)."""
        out: dict[int, int] = {}
        for h in self.handles:
            for p in self._try(self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
                used = getattr(p, "usedGpuMemory", None)
                if isinstance(used, int):
                    out[p.pid] = out.get(p.pid, 0) + used
        return out
