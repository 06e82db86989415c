"""Progress bars for long work (diffusion steps, speech chunks), as diffusers and
huggingface_hub show theirs: tqdm's, on stderr. Needs `transmuter[pipelines]` (tqdm)."""

from __future__ import annotations

import sys
from typing import Any

from transmuter.errors import InputError


def progress_bar(total: int, progress: bool | None) -> Any | None:
    """A tqdm bar of `total` steps, or None. `progress`: None shows one where stderr is a
    terminal and tqdm is installed, False never, True always (tqdm needed)."""
    if progress is not None and not isinstance(progress, bool):
        raise InputError(f"progress must be True, False or None; got {progress!r}")
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            raise InputError(
                "progress=True shows a tqdm bar: install transmuter[pipelines]"
            ) from None
        return None
    return tqdm(total=total)
