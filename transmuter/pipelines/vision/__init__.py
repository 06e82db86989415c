"""Image tasks and the image processors they share (processors.py)."""
