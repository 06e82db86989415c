"""text-to-image: seconds per image, Transmuter's pipeline (the denoising loop as one compiled
program) against the same ONNX files as ONNX Runtime sessions stepped by diffusers' scheduler.

    .venv/bin/python bench/bench_text_to_image_ort.py                       # tiny-sd, 32 x 32
    .venv/bin/python bench/bench_text_to_image_ort.py --repo sd15 --size 256

`--repo tiny` is tests/fixtures/pipelines/tiny-sd; `--repo sd15` is bench/.cache/sd15, made by
`/tmp/torchenv/bin/python bench/make_sd_sized.py` (SD 1.5's shapes, random weights); any other
value is a repo folder. One image of `--size` pixels square (default: the repo's, 32 for tiny,
512 for sd15), `--steps` (20) Euler discrete steps, guidance 7.5 (a UNet batch of two), the
same seeded initial latents on both sides.

- Transmuter: `transmuter.pipeline("text-to-image", repo, scheduler="euler")` called with
  output_type="np": text encoder, loop and VAE decoder in one program.
- ONNX Runtime: what optimum's ORTStableDiffusionPipeline does, written out: the tokenizer
  (transformers' CLIPTokenizer), text_encoder, unet and vae_decoder as InferenceSessions
  (CPUExecutionProvider, default SessionOptions: all graph optimizations, default threads) and
  diffusers' EulerDiscreteScheduler (from the repo's scheduler_config.json) stepping torch
  tensors in Python, the prompt and the empty negative prompt encoded one call each, as
  diffusers' encode_prompt does. diffusers is not a dependency of this project, so this side
  runs in another interpreter (`--ort-python`, default /tmp/torchenv/bin/python, which has
  diffusers, torch and onnxruntime): this same file with `--worker`, driven over its stdin,
  answering one JSON line per command.

`--stepped` adds a third engine: the same pipeline's models with a jitted step called from
Python per step (bench_text_to_image.py's "per step" side), to tell the loop's cost from the
model calls'.

First image: the engine's load (Transmuter's `pipeline()` reading the files; ORT's session
creation) plus its first image (Transmuter: tracing and XLA compilation included); imports are
excluded on both sides. Then `--repeats` rounds of one image per engine, the order reversed
every other round. Printed per engine: load and first-image seconds, the seconds of the first
image spent tracing, lowering and compiling (JAX's monitoring events), the median seconds per
image and its ratio to ORT's, programs compiled, and the largest absolute pixel difference to
ORT's image (floats in [0, 1]); then the load average before and after and each process's peak
resident memory. `--sequential` runs all of ORT's images first and ends its process before
Transmuter's (no interleaving; for sizes where both processes do not fit in memory together).
Under `--stepped` its first image's compiling overlaps the steps already dispatched (JAX runs
them asynchronously), so that figure is not compile time alone. The ORT worker times itself,
without the pipe and .npy round trip. `--json PATH` saves every timing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPOS = {
    "tiny": ROOT / "tests" / "fixtures" / "pipelines" / "tiny-sd",
    "sd15": ROOT / "bench" / ".cache" / "sd15",
}
PROMPT = "a photo of a red cube"
GUIDANCE = 7.5
SEED = 0


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# -- the ONNX Runtime side (runs in the interpreter that has diffusers) ----------------------


class OrtPipeline:
    """Optimum's ORTStableDiffusionPipeline, reduced to the text-to-image path measured."""

    def __init__(self, repo: Path):
        import onnxruntime as ort
        from diffusers import EulerDiscreteScheduler
        from transformers import CLIPTokenizer

        self.tokenizer = CLIPTokenizer.from_pretrained(repo / "tokenizer")
        self.scheduler = EulerDiscreteScheduler.from_pretrained(repo / "scheduler")
        self.sessions = {
            name: ort.InferenceSession(
                str(repo / name / "model.onnx"), providers=["CPUExecutionProvider"]
            )
            for name in ("text_encoder", "unet", "vae_decoder")
        }
        vae = json.loads((repo / "vae_decoder" / "config.json").read_text())
        self.scaling = float(vae.get("scaling_factor", 0.18215))
        spec = {i.name: i for i in self.sessions["unet"].get_inputs()}["timestep"]
        self.timestep_dtype = {"tensor(float)": "float32", "tensor(int64)": "int64"}.get(
            spec.type, "float32"
        )
        self.timestep_rank = len(spec.shape)

    def _encode(self, text: str):
        import numpy as np

        ids = self.tokenizer(
            text, padding="max_length", max_length=self.tokenizer.model_max_length, truncation=True
        ).input_ids
        session = self.sessions["text_encoder"]
        return session.run(["last_hidden_state"], {"input_ids": np.asarray([ids], np.int32)})[0]

    def __call__(self, latents, steps: int, guidance: float):
        import numpy as np
        import torch

        hidden = np.concatenate([self._encode(""), self._encode(PROMPT)])
        scheduler = self.scheduler
        scheduler.set_timesteps(steps)
        sample = torch.from_numpy(latents) * scheduler.init_noise_sigma
        unet = self.sessions["unet"]
        for t in scheduler.timesteps:
            rows = scheduler.scale_model_input(torch.cat([sample, sample]), t)
            timestep = np.asarray(t.item(), self.timestep_dtype).reshape((1,) * self.timestep_rank)
            output = unet.run(
                ["out_sample"],
                {"sample": rows.numpy(), "timestep": timestep, "encoder_hidden_states": hidden},
            )[0]
            unconditional, conditional = torch.from_numpy(output).chunk(2)
            output = unconditional + guidance * (conditional - unconditional)
            sample = scheduler.step(output, t, sample).prev_sample
        decoded = self.sessions["vae_decoder"].run(
            ["sample"], {"latent_sample": (sample / self.scaling).numpy()}
        )[0]
        return np.clip(decoded / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)


def worker(repo: Path) -> None:
    """Answer commands from stdin, one JSON line each: load, run LATENTS OUT STEPS, quit."""
    # Nothing here needs torchvision, and a build that does not match torch's (as one installed
    # in /tmp/torchenv has been) fails transformers' imports.
    sys.modules.setdefault("torchvision", None)
    import numpy as np
    import torch  # noqa: F401  (imports are not timed)
    from diffusers import EulerDiscreteScheduler  # noqa: F401
    from transformers import CLIPTokenizer  # noqa: F401

    def reply(**fields) -> None:
        print(json.dumps({**fields, "peak_rss_gib": peak_rss_gib()}), flush=True)

    reply(ready=True)
    pipe = None
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "quit":
            return
        start = time.perf_counter()
        if command == "load":
            pipe = OrtPipeline(repo)
        else:
            latents, out, steps = rest
            np.save(out, pipe(np.load(latents), int(steps), GUIDANCE))
        reply(seconds=time.perf_counter() - start)


class OrtClient:
    def __init__(self, python: str, repo: Path):
        self.process = subprocess.Popen(
            [python, __file__, "--worker", "--repo", str(repo)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.peak_rss_gib = self.last_seconds = 0.0
        self._read()

    def _read(self) -> dict:
        line = ""
        while not line.startswith("{"):  # skip whatever the libraries print
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the ONNX Runtime worker exited ({self.process.wait()})")
        answer = json.loads(line)
        self.peak_rss_gib = answer["peak_rss_gib"]
        return answer

    def ask(self, *words) -> float:
        self.process.stdin.write(" ".join(map(str, words)) + "\n")
        self.process.stdin.flush()
        self.last_seconds = self._read()["seconds"]
        return self.last_seconds

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            self.process.wait()


def progress(line: str) -> None:
    print(
        f"  [{time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.2f}] {line}",
        file=sys.stderr,
        flush=True,
    )


# -- the measurement (runs in the project's venv) -------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="tiny", help="tiny, sd15 or a repo folder")
    parser.add_argument("--size", type=int, default=None, help="pixels, height = width")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=None, help="default 5, 2 for sd15")
    parser.add_argument(
        "--stepped", action="store_true", help="also time a jitted step called from Python"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="ORT's images first, its process ended, then Transmuter's (when memory is short)",
    )
    parser.add_argument("--ort-python", default="/tmp/torchenv/bin/python")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repo = REPOS.get(args.repo, Path(args.repo))
    if args.worker:
        worker(repo)
        return
    if not (repo / "model_index.json").exists():
        sys.exit(f"{repo} has no model_index.json (for sd15: run bench/make_sd_sized.py)")
    repeats = args.repeats or (2 if args.repo == "sd15" else 5)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np

    import transmuter

    # Tracing, lowering and XLA compiling, as JAX reports them (seconds, summed).
    compiling = [0.0]
    events = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")

    def on_event(event: str, seconds: float, **_) -> None:
        if event.rsplit("/", 1)[-1] in events:
            compiling[0] += seconds

    jax.monitoring.register_event_duration_secs_listener(on_event)
    load_before = os.getloadavg()
    ort = OrtClient(args.ort_python, repo)  # imports done before anything is timed
    start = time.perf_counter()
    pipe = transmuter.pipeline("text-to-image", repo, scheduler="euler")
    loads = {"Transmuter": time.perf_counter() - start}
    size = args.size or pipe.default_size
    shape = (1, pipe.channels, size // pipe.vae_factor, size // pipe.vae_factor)
    latents = np.random.default_rng(SEED).standard_normal(shape, dtype=np.float32)
    scratch = tempfile.TemporaryDirectory()
    latents_path, ort_path = Path(scratch.name) / "latents.npy", Path(scratch.name) / "ort.npy"
    np.save(latents_path, latents)

    def transmuter_image():
        return pipe(
            PROMPT,
            num_inference_steps=args.steps,
            guidance_scale=GUIDANCE,
            height=size,
            width=size,
            latents=latents,
            output_type="np",
        )

    def ort_image():
        ort.ask("run", latents_path, ort_path, args.steps)
        return np.load(ort_path)

    engines = {"Transmuter": transmuter_image, "ORT": ort_image}
    programs = {"Transmuter": lambda: pipe.compiles, "ORT": lambda: None}
    if args.stepped:
        from bench_text_to_image import stepped

        generate, compiles = stepped(pipe)
        engines["T stepped"] = lambda: generate(args.steps, latents)
        programs["T stepped"] = lambda: compiles["count"]
        loads["T stepped"] = 0.0  # the pipeline's models, already read
    # The ORT worker times itself (sessions, images); the rest is timed here.
    ort_clock = {"ORT": lambda: ort.last_seconds}

    def timed(engine):
        start = time.perf_counter()
        image = engines[engine]()
        seconds = time.perf_counter() - start
        return image, ort_clock.get(engine, lambda: seconds)()

    images, firsts, compile_s = {}, {}, {}
    times: dict[str, list[float]] = {engine: [] for engine in engines}
    others = [engine for engine in engines if engine != "ORT"]
    phases = [["ORT"], others] if args.sequential else [list(engines)]
    for order in phases:
        for engine in order:
            if engine == "ORT":
                loads["ORT"] = ort.ask("load")
            before = compiling[0]
            images[engine], firsts[engine] = timed(engine)
            compile_s[engine] = compiling[0] - before
            progress(
                f"{engine}: load {loads[engine]:.2f} s, first image {firsts[engine]:.2f} s "
                f"({compile_s[engine]:.1f} s compiling)"
            )
        for round_ in range(repeats):
            for engine in order if round_ % 2 == 0 else order[::-1]:
                image, seconds = timed(engine)
                times[engine].append(seconds)
                progress(f"round {round_ + 1}: {engine} {seconds:.3f} s")
                difference = float(np.abs(image - images[engine]).max())
                if difference:
                    progress(f"{engine} changed its image by {difference:.1e} between calls")
        if "ORT" in order:
            ort.close()  # its memory back before the next phase
    scratch.cleanup()
    load_after = os.getloadavg()

    medians = {engine: statistics.median(times[engine]) for engine in engines}
    reference = images["Transmuter"]
    unclipped = float(np.mean((reference > 0) & (reference < 1)))
    print(
        f"text-to-image, {args.repo} at {size} x {size}, {args.steps} Euler steps, guidance "
        f"{GUIDANCE}, 1 image, {repeats} rounds; {jax.devices()[0]}, {os.cpu_count()} cores; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"{'engine':12}{'load s':>9}{'first image s':>15}{'compiling s':>13}{'s / image':>11}"
        f"{'/ ORT':>7}{'programs':>10}{'max|diff|':>11}"
    )
    for engine in engines:
        count = programs[engine]()
        difference = float(np.abs(images[engine] - images["ORT"]).max())
        print(
            f"{engine:12}{loads[engine]:9.2f}{loads[engine] + firsts[engine]:15.2f}"
            f"{'-' if count is None else f'{compile_s[engine]:.1f}':>13}"
            f"{medians[engine]:11.3f}{medians[engine] / medians['ORT']:7.2f}"
            f"{'-' if count is None else count:>10}{difference:11.1e}"
        )
    print(
        "first image: load + first call; compiling: JAX's tracing, lowering and XLA compile "
        f"time within it; max|diff|: largest pixel difference to ORT's image ({unclipped:.0%} of "
        f"Transmuter's values inside (0, 1)); peak memory {peak_rss_gib():.1f} GiB here, "
        f"{ort.peak_rss_gib:.1f} GiB in ORT's process"
    )
    if args.json:
        record = {
            "repo": args.repo,
            "size": size,
            "steps": args.steps,
            "load_average": [load_before, load_after],
            "peak_rss_gib": {"transmuter": peak_rss_gib(), "ort": ort.peak_rss_gib},
            "engines": {
                engine: {
                    "load": loads[engine],
                    "first_image": firsts[engine],
                    "compiling": compile_s[engine],
                    "images": times[engine],
                    "programs": programs[engine](),
                    "max_abs_difference": float(np.abs(images[engine] - images["ORT"]).max()),
                }
                for engine in engines
            },
        }
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
