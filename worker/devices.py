"""What this machine offers: accelerators (through torch) or the CPU, and memory."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from control_plane.protocol import DeviceInfo

_MEMINFO = Path("/proc/meminfo")


def detect_devices() -> list[DeviceInfo]:
    """CUDA devices torch can see, else the CPU as the one device."""
    import torch

    if torch.cuda.is_available():
        return [
            DeviceInfo(
                kind="cuda",
                name=torch.cuda.get_device_name(i),
                memory_bytes=int(torch.cuda.get_device_properties(i).total_memory),
            )
            for i in range(torch.cuda.device_count())
        ]
    name = platform.processor() or platform.machine() or "cpu"
    return [DeviceInfo(kind="cpu", name=f"{name} x{os.cpu_count() or 1}", memory_bytes=0)]


def default_device(devices: list[DeviceInfo]) -> str:
    """The device replicas run on when the spec says ``any``: CUDA when present."""
    return "cuda" if any(d.kind == "cuda" for d in devices) else "cpu"


def total_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def free_memory_bytes() -> int:
    """Memory available to new processes (``MemAvailable``), best estimate elsewhere."""
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass  # not Linux: fall back to free pages, an underestimate
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def gpu_utilization_pct() -> list[float] | None:
    """Percent busy of each CUDA device, or None (no GPU, or NVML unavailable)."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return [float(torch.cuda.utilization(i)) for i in range(torch.cuda.device_count())]
    except Exception:  # NVML missing (pynvml not installed) or refusing: not measurable
        return None
