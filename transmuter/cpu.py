"""The host machine where results depend on it: the CPU's vector extensions, and its memory.

Two correct runtimes can disagree because of the CPU they run on: float sums are added in an
order that depends on the vector width, and ONNX Runtime's u8 x s8 integer kernels are exact only
with VNNI (see `transmuter.checking.reference_saturation`). The test log and `transmuter check`
name the extensions so that a machine-dependent difference is visible as one.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

# Instructions that multiply u8 by s8 and accumulate in int32 without a 16-bit step: AVX-512
# VNNI as numpy names it, AVX-VNNI and AMX as Linux does (numpy does not detect those two).
_VNNI = frozenset({"AVX512VNNI", "AVX_VNNI", "AMX_INT8"})


@functools.cache
def vector_extensions() -> tuple[str, ...]:
    """The CPU's SIMD extensions, sorted: what numpy's CPUID probe found (so an emulated CPU
    reports what it emulates), plus AVX-VNNI and AMX from Linux's /proc/cpuinfo."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as features
    found = {name for name, present in features.items() if present}
    return tuple(sorted(found | _linux_only_flags()))


def _linux_only_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return {f.upper() for f in value.split() if f.startswith(("avx_vnni", "amx"))}
    return set()


def has_vnni() -> bool | None:
    """Whether an x86 CPU multiplies u8 x s8 with VNNI; None on other architectures."""
    if platform.machine().lower() not in ("x86_64", "amd64", "x86", "i686"):
        return None
    return bool(_VNNI.intersection(vector_extensions()))


def describe() -> str:
    """One line for logs: the architecture and its vector extensions."""
    vnni = {True: "VNNI", False: "no VNNI", None: "VNNI n/a"}[has_vnni()]
    return f"CPU: {platform.machine()}, {vnni}; {' '.join(vector_extensions()) or 'no SIMD'}"


@functools.cache
def physical_memory() -> int:
    """This machine's physical memory in bytes: no tensor larger than it can be made (int64's
    limit where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 2**63 - 1
