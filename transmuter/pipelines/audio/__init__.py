"""Audio tasks and their features: classification, speech recognition, text-to-speech."""
