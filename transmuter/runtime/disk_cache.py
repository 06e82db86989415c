"""The on-disk layer of the compile cache: JAX's persistent compilation cache, set up for
`compile(..., cache_dir=...)`, and a compile that says whether it came from disk and repairs
entries it finds damaged.

JAX warns and recompiles when an entry does not read back (a truncated file), but never writes
over it, so every later process would warn and compile again; the damaged entries are removed
here and the program compiled once more, which writes it afresh. Entries are JAX's own format
(compressed serialized executables), read through its compilation_cache module.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from transmuter.errors import CacheError, InputError

_DAMAGED = "Error reading persistent compilation cache entry"
_HITS = "/jax/compilation_cache/cache_hits"
_events = {_HITS: 0}
_listening = False


def use_persistent_cache(path: str | os.PathLike) -> None:
    """Persist compiled programs under `path` through JAX's persistent compilation cache (a
    process-wide setting), with no minimum compile time, so that a later process skips XLA."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"cache_dir {path!r} is a file: give a folder (it is made if missing)")
    os.makedirs(path, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != path:
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def compile_lowered(
    lowered, lower_again: Callable[[], Any], options: dict[str, str]
) -> tuple[Any, str | None]:
    """`lowered.compile(options)`, and where it came from: "hit" (read from the persistent cache),
    "miss" (compiled and written), "repaired" (a damaged entry removed and written again, from
    `lower_again()`), or None when the persistent cache is off."""
    global _listening
    if not _listening:
        jax.monitoring.register_event_listener(_count)
        _listening = True
    hits = _events[_HITS]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = lowered.compile(compiler_options=options or None)
    damaged = [w for w in caught if str(w.message).startswith(_DAMAGED)]
    for w in caught:
        if w not in damaged:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    folder = jax.config.jax_compilation_cache_dir
    if damaged and folder:
        removed = _remove_damaged(Path(folder))
        if removed:
            # The entry is gone, so a compile writes it, once JAX's in-memory caches no longer
            # hand back the executable of the first compile.
            jax.clear_caches()
            lower_again().compile(compiler_options=options or None)
            warnings.warn(
                f"removed {removed} damaged entries from the compile cache {folder!r}; each is "
                "written again when its program next compiles (this one already is)",
                stacklevel=2,
            )
        return compiled, "repaired"
    if _events[_HITS] > hits:
        return compiled, "hit"
    return compiled, "miss" if folder else None


def _count(event: str, **_: Any) -> None:
    if event in _events:
        _events[event] += 1


def _remove_damaged(folder: Path) -> int:
    """Remove the cache entries that no longer decompress; returns how many."""
    from jax._src import compilation_cache  # the entries' format is JAX's own

    removed = 0
    for path in folder.glob("*-cache"):
        try:
            data = compilation_cache.decompress_executable(path.read_bytes())
            compilation_cache.extract_executable_and_time(data)
        except Exception:  # any failure to read it back: the entry is damaged
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def guarded(program, folder: str) -> Any:
    """`program`, read from the persistent cache: a call XLA refuses (the entry holds another
    program, as when two entry files are swapped) raises a CacheError saying what to do; the
    program's other attributes (`as_text()`, which tests read the optimized HLO by) are its own."""
    return _Guarded(program, folder)


class _Guarded:
    def __init__(self, program, folder: str):
        self._program = program
        self._folder = folder

    def __call__(self, *args):
        try:
            return self._program(*args)
        except jax.errors.JaxRuntimeError as exc:
            raise CacheError(
                f"a program read from the compile cache {self._folder!r} does not fit its call "
                f"({str(exc).splitlines()[0][:200]}): the cache holds a damaged or foreign "
                "entry; delete the folder (or its files) and run again"
            ) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program, name)
