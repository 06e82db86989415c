"""Text tasks on encoders and decoders: feature extraction, classification, fill-mask,
question answering, zero-shot classification, text generation and text-to-text."""
