"""How the graph holds its weights: each initializer once, in memory a device can run on in place.

XLA:CPU reads a host array where it lies, with no copy (`jax.device_put` aliases it), when the
array is C-contiguous and starts on an ALIGNMENT boundary; otherwise the runtime's params would
be a second copy of every weight beside the graph's own. So the front end gives every
initializer such memory (a memory-mapped external tensor at an aligned offset already is one),
and the runtime makes `shareable` what the passes computed.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

ALIGNMENT = 64
# Arrays this large get memory mapped for them alone (`_aligned_bytes`).
MAPPED_MIN_BYTES = 1 << 20
# Plain process memory where the platform has the flag (Windows has not), not shared memory.
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


class _FilePages(mmap.mmap):
    """A read-only mapping of part of a file: the pages `release` may drop (never process memory,
    which MADV_DONTNEED would zero)."""


def mapped_file(path: str | os.PathLike, offset: int, nbytes: int) -> np.ndarray:
    """`nbytes` of the file at `offset`, memory-mapped read-only: read on first use, from the page
    cache."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        pages = _FilePages(
            f.fileno(), offset + nbytes - start, access=mmap.ACCESS_READ, offset=start
        )
    return np.frombuffer(pages, np.uint8, count=nbytes, offset=offset - start)


def release(array: np.ndarray) -> None:
    """Drop the pages of a `mapped_file` array from this process's resident memory, once a pass
    has made the copy it keeps instead: a model's file would otherwise stay resident until load
    ends, beside the copies (SD 1.5's UNet: its 2.3 GB of rearranged kernels). They come back
    from the page cache if read again; anything else is left alone."""
    pages = file_pages(array)
    if pages is not None and hasattr(mmap, "MADV_DONTNEED"):
        pages.madvise(mmap.MADV_DONTNEED)


def file_pages(array: np.ndarray) -> mmap.mmap | None:
    """The `mapped_file` mapping `array` views, or None."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's
        base = base.obj
    return base if isinstance(base, _FilePages) else None


def is_shareable(array: np.ndarray) -> bool:
    """Whether a device may run on `array`'s memory in place: aligned, C-contiguous and
    read-only (nothing can change a weight under a compiled program)."""
    flags = array.flags
    return flags.c_contiguous and not flags.writeable and array.ctypes.data % ALIGNMENT == 0


def shareable(array: np.ndarray) -> np.ndarray:
    """`array` itself if `is_shareable`, else such a copy of it."""
    if is_shareable(array):
        return array
    copy = empty(array.shape, array.dtype)
    np.copyto(copy, array)
    copy.flags.writeable = False
    return copy


def stack(parts: list[np.ndarray]) -> np.ndarray:
    """`np.stack(parts)` (one shape and dtype), made shareable as it is written: no second copy."""
    out = empty((len(parts), *parts[0].shape), parts[0].dtype)
    np.stack(parts, out=out)
    out.flags.writeable = False
    return out


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable, C-contiguous, ALIGNMENT-aligned array (set it read-only once filled)."""
    dtype = np.dtype(dtype)
    return (
        _aligned_bytes(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        .view(dtype)
        .reshape(shape)
    )


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """`nbytes` uint8 starting on an ALIGNMENT boundary."""
    if nbytes >= MAPPED_MIN_BYTES:
        # Pages of its own, which go back to the system when the weight is freed: malloc keeps
        # freed blocks of up to 32 MiB for reuse, so a model's load buffers would stay resident.
        return np.frombuffer(mmap.mmap(-1, nbytes, **_PRIVATE), np.uint8)
    buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start : start + nbytes]
