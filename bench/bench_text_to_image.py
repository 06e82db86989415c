"""text-to-image: seconds per image, the denoising loop compiled as one program against the same
UNet driven step by step from Python (as diffusers and ONNX Runtime pipelines drive it).

Run: .venv/bin/python bench/bench_text_to_image.py [--steps 20] [--repeats 5]
(the tiny random-weight repo of tests/fixtures/make_diffusion.py, 32 x 32, one image, guided).
Both sides run the same pieces: the text encoder, the UNet on a batch of two with
classifier-free guidance, transmuter.pipelines.diffusion.schedulers' Euler update, the VAE decoder. The
loop side is the pipeline itself; the stepped side jits the text encoder, one step, and the
decoder separately and calls the step `steps` times from Python, reading nothing back until the
end. Prints first-call (compile) seconds, steady seconds per image, and programs compiled.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.pipelines.diffusion.text_to_image import load_diffusion_repo

REPO = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pipelines" / "tiny-sd"
PROMPT = "a photo of a red cube"


def stepped(pipe):
    """The same generation as `pipe`, one jitted call per step; returns (generate, compiles)."""
    compiles = {"count": 0}
    scheduler = pipe.scheduler

    @transmuter.jit  # the XLA options the pipeline's own program gets
    def encode(params, ids):
        compiles["count"] += 1
        return transmuter.run(pipe.text_encoder, {"input_ids": ids}, params=params)[
            "last_hidden_state"
        ]

    @transmuter.jit
    def step(params, tables, i, sample, hidden, guidance):
        compiles["count"] += 1
        scaled = scheduler.scale(tables, i, sample)
        output = pipe._unet(params, scaled, tables["timesteps"][i], hidden, True)
        unconditional, conditional = jnp.split(output, 2)
        output = unconditional + guidance * (conditional - unconditional)
        return scheduler.step(tables, i, 0, output, sample, (), None)[0]

    @transmuter.jit
    def decode(params, sample):
        compiles["count"] += 1
        out = transmuter.run(
            pipe.vae_decoder, {"latent_sample": sample / pipe.scaling}, params=params
        )["sample"]
        return jnp.clip(out / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)

    def generate(steps, latents):
        tables = {k: jnp.asarray(v.astype(np.float32)) for k, v in scheduler.tables(steps).items()}
        negative_and_prompt = pipe._tokenize(["", PROMPT]).astype(np.int32)
        hidden = encode(pipe.text_encoder.params, negative_and_prompt)
        sample = jnp.asarray(latents) * scheduler.init_noise_sigma(scheduler.tables(steps))
        for i in range(steps):
            sample = step(pipe.unet.params, tables, jnp.int32(i), sample, hidden, 7.5)
        return np.asarray(decode(pipe.vae_decoder.params, sample))

    return generate, compiles


def timed(fn, repeats):
    start = time.perf_counter()
    first = fn()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return first, compile_s, (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    pipe = transmuter.pipeline("text-to-image", load_diffusion_repo(REPO), scheduler="euler")
    latents = np.random.default_rng(0).standard_normal((1, 4, 16, 16), dtype=np.float32)

    def loop():
        return pipe(PROMPT, num_inference_steps=args.steps, latents=latents, output_type="np")

    generate, compiles = stepped(pipe)
    looped, loop_compile, loop_s = timed(loop, args.repeats)
    by_step, step_compile, step_s = timed(lambda: generate(args.steps, latents), args.repeats)
    difference = float(np.abs(looped - by_step).max())
    print(f"text-to-image, tiny-sd 32x32, {args.steps} steps, Euler, guided, {jax.devices()[0]}")
    print(f"{'':14}{'first call s':>14}{'s / image':>12}{'programs':>10}")
    print(f"{'one program':14}{loop_compile:14.2f}{loop_s:12.4f}{pipe.compiles:10d}")
    print(f"{'per step':14}{step_compile:14.2f}{step_s:12.4f}{compiles['count']:10d}")
    print(f"loop speed-up x{step_s / loop_s:.2f}; images differ by at most {difference:.1e}")


if __name__ == "__main__":
    main()
