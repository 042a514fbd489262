"""The kind of CPU a run's figures belong to: what a record of measured figures is kept under."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_kind(cpuinfo: str | None = None) -> dict:
    """What a CPU's figures depend on: its vendor, family and model numbers (a virtual machine's model name may be
    the vendor's alone) and its bf16 units; `slug` names its record."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            cpuinfo = ""
    found, flags = {"vendor": platform.machine(), "family": 0, "model": 0, "name": platform.processor()}, set()
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "model name": "name"}
    for line in cpuinfo.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in keys:
            found[keys[key]] = int(value) if key in ("cpu family", "model") else value
        elif key == "flags":
            flags = set(value.split())
            break
    units = [unit for unit, flag in (("amx", "amx_bf16"), ("avx512bf16", "avx512_bf16")) if flag in flags]
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(found["vendor"], found["vendor"].lower())
    slug = "-".join([vendor, str(found["family"]), str(found["model"]), *units])
    return {**found, "bf16_units": units, "slug": slug}
