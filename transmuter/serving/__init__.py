"""Serving: concurrent callers batched into few pipeline calls (`Serving`), and an HTTP server
speaking OpenAI's and text-embeddings-inference's APIs on top of it (`transmuter serve`, the
`serve` extra)."""

from __future__ import annotations

from transmuter.serving.batching import Serving

__all__ = ["Serving"]
