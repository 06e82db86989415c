"""Text-to-image: the one-program denoising loop and its schedulers."""
