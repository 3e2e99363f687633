"""Shared by the benchmarks: peak-RSS measurement and machine description, from /proc.

Peak memory uses VmHWM after resetting it through /proc/self/clear_refs; ``ru_maxrss`` would also
count the parent's peak, which Linux carries across fork+exec.
"""

from __future__ import annotations

import contextlib
import gc
import platform
import re
from pathlib import Path


def status_kib(key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+)\s+kB", Path("/proc/self/status").read_text(), re.M)
    if m is None:
        raise RuntimeError(f"/proc/self/status has no {key}")
    return int(m.group(1))


def reset_peak_rss() -> int:
    """Collect garbage, reset the RSS high-water mark, return the RSS (KiB) measurement starts from."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")


def peak_rss() -> int:
    """The RSS high-water mark (KiB) since the last :func:`reset_peak_rss`."""
    return status_kib("VmHWM")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def mem_total_gib() -> float:
    m = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    return int(m.group(1)) / 2**20 if m else float("nan")
