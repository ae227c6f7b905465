"""Noise measured, not suffered: what disturbed each timing sample.

On the host, around every sample: the process's involuntary context switches (another task took a
core from it: preemption, one scheduler slice at a time), the system's CPU pressure stall time
(``/proc/pressure/cpu``), steal time (a hypervisor ran someone else) and cgroup throttling (a CPU
quota ran out). A sample during which the process was preempted, stolen from or throttled is
*disturbed*. On the GPU, around every mode: NVML's clock event reasons (thermal or power slowdown)
and the SM clock, where nvidia-ml-py is installed.

``split`` drops the disturbed samples of a mode's round while at least ``MIN_KEPT`` of them remain
undisturbed; otherwise it keeps them all and flags the round ``disturbed``, which withholds the
significance of any comparison that uses it and makes an audit's replay of it uninformative.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

MIN_KEPT = 0.5  # the least fraction of undisturbed samples whose round is used without its disturbed ones
_PSI = Path("/proc/pressure/cpu")
_STAT = Path("/proc/stat")
_CGROUP_STAT = Path("/sys/fs/cgroup/cpu.stat")
# NVML clocks event reasons that slow the GPU down against its will (not idle, not an application setting)
NVML_SLOWDOWN = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown"}


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class HostProbe:
    """Counters read before and after a sample; ``delta`` says what happened in between."""

    def __init__(self):
        self.psi = _read(_PSI) is not None
        self.steal = (_read(_STAT) or "").startswith("cpu ")
        text = _read(_CGROUP_STAT) or ""
        self.cgroup = "nr_throttled" in text

    def read(self) -> tuple:
        psi = steal = throttled = throttled_us = 0
        if self.psi:
            for field in (_read(_PSI) or "").split("\n", 1)[0].split():
                if field.startswith("total="):
                    psi = int(field[6:])
        if self.steal:
            cols = (_read(_STAT) or "").split("\n", 1)[0].split()
            steal = int(cols[8]) if len(cols) > 8 else 0
        if self.cgroup:
            for line in (_read(_CGROUP_STAT) or "").splitlines():
                key, _, value = line.partition(" ")
                if key == "nr_throttled":
                    throttled = int(value)
                elif key == "throttled_usec":
                    throttled_us = int(value)
        return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw, psi, steal, throttled, throttled_us

    @staticmethod
    def delta(before: tuple, after: tuple) -> dict:
        d = [b - a for a, b in zip(before, after, strict=True)]
        return {"involuntary_switches": d[0], "psi_some_us": d[1], "steal_ticks": d[2], "throttled": d[3],
                "throttled_us": d[4], "disturbed": bool(d[0] > 0 or d[2] > 0 or d[3] > 0)}


def split(samples: list[float], marks: list[dict]) -> tuple[list[float], dict]:
    """(samples to use, the round's disturbance record) for one mode's round of samples."""
    flags = [bool(m.get("disturbed")) for m in marks]
    clean = [s for s, bad in zip(samples, flags, strict=True) if not bad]
    record = {
        "samples": len(samples),
        "disturbed_samples": sum(flags),
        "involuntary_switches": sum(m.get("involuntary_switches", 0) for m in marks),
        "psi_some_us": sum(m.get("psi_some_us", 0) for m in marks),
        "steal_ticks": sum(m.get("steal_ticks", 0) for m in marks),
        "throttled_us": sum(m.get("throttled_us", 0) for m in marks),
    }
    if flags and len(clean) >= MIN_KEPT * len(samples) and clean:
        record.update(dropped_us=[s for s, bad in zip(samples, flags, strict=True) if bad], disturbed=False)
        return clean, record
    record.update(dropped_us=[], disturbed=any(flags))
    return list(samples), record


def cpu_mhz() -> list[float]:
    """The cores' clocks now, where the OS says (cpufreq, else /proc/cpuinfo)."""
    from .provenance import cpu_clocks_mhz

    return cpu_clocks_mhz()


def clock_range(mhz: list[float]) -> list[float] | None:
    """[lowest, highest] of the clocks read at a mode's start and end: a frequency change shows here."""
    return [min(mhz), max(mhz)] if mhz else None


class GpuProbe:
    """NVML's clock event reasons and SM clock of the current device, or nothing without nvidia-ml-py."""

    def __init__(self):
        self.handle = None
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            index = torch.cuda.current_device()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                index = int(visible.split(",")[index])
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no NVML here: the record says so
            self.handle = None

    def read(self) -> dict:
        if self.handle is None:
            return {"nvml": False}
        nv = self.nvml
        get = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        reasons = int(get(self.handle))
        return {"nvml": True, "sm_mhz": int(nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM)),
                "slowdown": sorted(name for bit, name in NVML_SLOWDOWN.items() if reasons & bit)}


def gpu_record(before: dict, after: dict) -> dict:
    """A mode's GPU clock record: SM clock at its start and end and any slowdown NVML reported then; a
    slowdown marks the mode's round disturbed."""
    if not before.get("nvml"):
        return {"gpu": {"nvml": False}}
    slowdown = sorted(set(before["slowdown"]) | set(after["slowdown"]))
    record = {"gpu": {"nvml": True, "sm_mhz": [before["sm_mhz"], after["sm_mhz"]], "slowdown": slowdown}}
    if slowdown:
        record["disturbed"] = True
    return record
