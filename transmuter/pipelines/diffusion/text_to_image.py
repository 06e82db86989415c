"""The text-to-image task with Stable Diffusion repos in Optimum's ONNX layout: prompts in,
Pillow images out, as diffusers' StableDiffusionPipeline (and, given `image=`, its img2img
pipeline) makes them.

Where diffusers runs a Python loop that calls the UNet and the scheduler once per step, here the
text encoder, the whole denoising loop (`lax.fori_loop` over the UNet's JAX function, the
scheduler's update as array code from schedulers.py, classifier-free guidance as a batch of
two) and the VAE decoder are ONE compiled program: no host round trip per step. Progress comes
out of the loop through `jax.debug.callback`. A program is compiled per (steps, height, width,
batch, guidance on or off, guidance rescaled or not, image-to-image or not) and reused; the
step tables, the guidance scale and rescale, the strength and the noise are its arguments. No
dim is bucketed: each image size and batch is its own program.

The repo: model_index.json, text_encoder/, unet/, vae_decoder/ (and vae_encoder/ for
image-to-image) each with model.onnx and config.json, tokenizer/ (tokenizer.json, or CLIP's
vocab.json + merges.txt) and scheduler/scheduler_config.json; a folder or hf://org/repo.
Needs `transmuter[pipelines]` (the tokenizer, tqdm's progress bar) and `transmuter[image]`.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import transmuter
from transmuter.compile_notice import slow_compile
from transmuter.errors import InputError, ModelLoadError
from transmuter.frontend import hub
from transmuter.pipelines.base import Task, choice
from transmuter.pipelines.diffusion.schedulers import Scheduler, make_scheduler
from transmuter.pipelines.progress import progress_bar
from transmuter.pipelines.repo import Repo, json_file
from transmuter.pipelines.vision.processors import load_image

MODELS = ("text_encoder", "unet", "vae_decoder", "vae_encoder")
FILES = (
    "model_index.json",
    *(f"{m}/{f}" for m in MODELS for f in ("model.onnx", "config.json")),
    "tokenizer/tokenizer.json",
    "tokenizer/vocab.json",
    "tokenizer/merges.txt",
    "tokenizer/tokenizer_config.json",
    "scheduler/scheduler_config.json",
)
# CLIP's pre-tokenization: its special tokens, English contractions, letter runs, single
# digits, and runs of other non-space characters (transformers' CLIPTokenizer).
CLIP_PATTERN = (
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"
    r"[^\s\p{L}\p{N}]+"
)
# diffusers' pipelines require sizes divisible by 8 whatever the VAE's factor.
SIZE_MULTIPLE = 8


@dataclass
class DiffusionRepo(Repo):
    """A diffusers-style repository: `configs` maps each model folder (text_encoder, unet,
    vae_decoder, vae_encoder) to its config.json, `scheduler_config` is
    scheduler/scheduler_config.json; `config` is model_index.json and `onnx` maps each model
    folder to its model.onnx."""

    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    scheduler_config: dict[str, Any] = field(default_factory=dict)

    def model(self, role: str) -> transmuter.Model:
        if role not in self.onnx:
            raise ModelLoadError(f"{self.source} has no {role}/model.onnx; found {self.found}")
        return super().model(role)


def load_diffusion_repo(source: str | os.PathLike, *, dtype: str | None = None) -> DiffusionRepo:
    """Read a Stable Diffusion repo in Optimum's ONNX layout from a folder or from
    `hf://org/repo[@revision]` (the files present, fetched at one commit). Optimum's layout
    has one weight type: `dtype` must be None."""
    if dtype is not None:
        raise ModelLoadError(
            f"dtype={dtype!r} picks transformers.js weight files; a diffusers repo in "
            "Optimum's layout has one set (give dtype=None)"
        )
    if isinstance(source, str) and source.startswith(hub.PREFIX):
        name = source
        root = hub.hub_file(f"{source.rstrip('/')}/model_index.json")
        local = hub.fetch_present(root.repo, list(FILES), root.revision)
        found = sorted(local)
    else:
        name = os.fspath(source)
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise ModelLoadError(f"{name!r} is not a folder (or an hf://org/repo source)")
        local = {path: folder / path for path in FILES if (folder / path).is_file()}
        found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    for needed in ("model_index.json", "scheduler/scheduler_config.json"):
        if needed not in local:
            raise ModelLoadError(f"{name} has no {needed}: not a diffusers repo; found {found}")
    return DiffusionRepo(
        source=name,
        config=json_file(local["model_index.json"]),
        generation_config={},
        preprocessor_config={},
        onnx={m: local[f"{m}/model.onnx"] for m in MODELS if f"{m}/model.onnx" in local},
        tokenizer_config=json_file(local.get("tokenizer/tokenizer_config.json")),
        tokenizer=_clip_tokenizer(name, local),
        found=found,
        configs={m: json_file(local.get(f"{m}/config.json")) for m in MODELS},
        scheduler_config=json_file(local["scheduler/scheduler_config.json"]),
    )


def _clip_tokenizer(name: str, local: Mapping[str, Path]) -> Any:
    """tokenizer/tokenizer.json, else CLIP's byte-level BPE built from vocab.json and
    merges.txt as transformers' CLIPTokenizer builds it; None when neither is there."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    if "tokenizer/tokenizer.json" in local:
        tokenizer = Tokenizer.from_file(str(local["tokenizer/tokenizer.json"]))
        # The task pads and truncates itself, whatever the file fixes.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer
    if "tokenizer/vocab.json" not in local or "tokenizer/merges.txt" not in local:
        return None
    vocab = json_file(local["tokenizer/vocab.json"])
    lines = local["tokenizer/merges.txt"].read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines if line and not line.startswith("#version")]
    tokenizer = Tokenizer(
        BPE(vocab, merges, end_of_word_suffix="</w>", unk_token="<|endoftext|>", fuse_unk=False)
    )
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    ends, starts = "<|endoftext|>", "<|startoftext|>"
    if tokenizer.token_to_id(ends) is None or tokenizer.token_to_id(starts) is None:
        raise ModelLoadError(f"{name}: tokenizer/vocab.json lacks {starts} or {ends}")
    tokenizer.post_processor = processors.RobertaProcessing(
        (ends, tokenizer.token_to_id(ends)),
        (starts, tokenizer.token_to_id(starts)),
        trim_offsets=False,
        add_prefix_space=False,
    )
    return tokenizer


@dataclass(frozen=True)
class _Request:
    """One call's arrays and the static choices that pick its program."""

    ids: np.ndarray  # [rows, length]: negative prompts first when guided
    shape: tuple[int, int, int, int]  # the latents' [batch, channels, height, width]
    steps: int
    begin: int  # the first step run (image-to-image skips the noisiest)
    guided: bool
    rescale: float  # guidance_rescale, 0 for none
    pixels: np.ndarray | None  # [batch, 3, height, width] in [-1, 1], for image-to-image


class TextToImage(Task):
    """Generate images from prompts: a prompt gives its images (num_images_per_prompt of them:
    a list of Pillow images, or float32 [n, height, width, 3] in [0, 1] with
    output_type="np"), a list of prompts a list with each prompt's images, a generator of
    prompts a generator of them (one prompt a run). Option: scheduler (a diffusers class
    name or "euler", "euler_a", "ddim", "dpm++2m"; default the repo's scheduler_config.json).
    Per call: num_inference_steps (50), guidance_scale (7.5; above 1 runs classifier-free
    guidance), guidance_rescale (0.0; diffusers' rescale of the guided prediction toward the
    conditional one's standard deviation, in [0, 1]), negative_prompt, height and width
    (multiples of 8; default the UNet's sample_size times the VAE's factor),
    num_images_per_prompt (1), latents (the initial noise, [batch, 4, height / f, width / f]
    before the scheduler's scaling, as diffusers takes it) or seed (same seed, same images,
    ancestral samplers' per-step noise included), image and strength (0.8) for image-to-image
    (then latents is the noise added; diffusers' img2img has no guidance_rescale, the same
    step applies here), output_type ("pil": a list of Pillow images; "np": float32
    [n, height, width, 3] in [0, 1]), callback (called as callback(step, timestep,
    latents) after each step, from inside the compiled loop) and progress (a tqdm bar of the
    steps, reported from inside the loop: None shows it where stderr is a terminal, False
    never, True always)."""

    task = "text-to-image"
    load_repo = staticmethod(load_diffusion_repo)  # `pipeline()` reads its repos with this

    def __init__(self, repo: Repo, *, scheduler: str | None = None):
        if not isinstance(repo, DiffusionRepo):
            raise ModelLoadError(
                f"{repo.source}: text-to-image reads a diffusers repo (model_index.json, unet/, "
                "text_encoder/, vae_decoder/, ...): load it with load_diffusion_repo"
            )
        self.repo = repo
        self.scheduler: Scheduler = make_scheduler(repo.scheduler_config, scheduler)
        self.tokenizer = repo.tokenizer
        if self.tokenizer is None:
            raise ModelLoadError(
                f"{repo.source} has no tokenizer/tokenizer.json or tokenizer/vocab.json + "
                f"merges.txt; found {repo.found}"
            )
        self.text_encoder = repo.model("text_encoder")
        self.unet = repo.model("unet")
        self.vae_decoder = repo.model("vae_decoder")
        self._check_interfaces()
        unet, vae = repo.configs["unet"], repo.configs["vae_decoder"]
        self.channels = int(unet.get("in_channels", 4))
        self.vae_factor = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1)
        self.default_size = int(unet.get("sample_size", 64)) * self.vae_factor
        self.scaling = float(vae.get("scaling_factor", 0.18215))
        if vae.get("shift_factor") is not None:
            raise ModelLoadError(f"{repo.source}: the VAE's shift_factor is not supported")
        self.length, self.pad_id = self._text_settings()
        self.compiles = 0  # programs traced so far: one per (steps, size, batch, mode)
        self._program = transmuter.jit(
            self._generate, static_argnames=("guided", "rescaled", "report", "encode")
        )
        self._noise = transmuter.jit(
            _noise, static_argnames=("shape", "steps", "stochastic", "encode")
        )
        self._callback: Callable | None = None
        self._bar: Any = None

    def _check_interfaces(self) -> None:
        want = {
            "text_encoder": (["input_ids"], "last_hidden_state", self.text_encoder),
            "unet": (["sample", "timestep", "encoder_hidden_states"], "out_sample", self.unet),
            "vae_decoder": (["latent_sample"], "sample", self.vae_decoder),
        }
        for role, (inputs, output, model) in want.items():
            if sorted(model.inputs) != sorted(inputs) or output not in model.outputs:
                raise ModelLoadError(
                    f"{self.repo.source}: {role}/model.onnx takes {model.inputs} and gives "
                    f"{model.outputs}; Stable Diffusion's (Optimum's export) takes {inputs} and "
                    f"gives {output} (SDXL-style added conditions are not supported)"
                )

    def _text_settings(self) -> tuple[int, int]:
        """The prompt length (tokenizer_config.json's model_max_length, else the text
        encoder's position count) and the pad id (its pad_token, else CLIP's <|endoftext|>)."""
        config = self.repo.tokenizer_config
        length = config.get("model_max_length")
        if not isinstance(length, int) or length > 1 << 20:
            length = self.repo.configs["text_encoder"].get("max_position_embeddings")
        if not isinstance(length, int):
            raise ModelLoadError(
                f"{self.repo.source}: no prompt length in tokenizer/tokenizer_config.json "
                "(model_max_length) or text_encoder/config.json (max_position_embeddings)"
            )
        pad = config.get("pad_token", "<|endoftext|>")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        pad_id = self.tokenizer.token_to_id(pad)
        if pad_id is None:
            raise ModelLoadError(
                f"{self.repo.source}: the pad token {pad!r} is not in the vocabulary"
            )
        return length, pad_id

    def __call__(self, prompt: Any = None, **options: Any) -> Any:
        if prompt is None:
            raise InputError("give a prompt, a list of prompts or a generator of them")
        return super().__call__(prompt, **options)

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def describe_items(self) -> str:
        return "give a prompt, a list of prompts or a generator of them"

    def run_items(
        self,
        items: list,
        *,
        negative_prompt: str | Sequence[str] | None = None,
        num_inference_steps: int = 50,
        guidance_scale: float = 7.5,
        guidance_rescale: float = 0.0,
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        latents: Any = None,
        seed: int | None = None,
        image: Any = None,
        strength: float | None = None,
        output_type: str = "pil",
        callback: Callable[[int, float, np.ndarray], Any] | None = None,
        progress: bool | None = None,
    ) -> list:
        """Each prompt's images (the Serving contract: one result per prompt)."""
        choice(output_type, "output_type", ("pil", "np"))
        request = self._request(
            items,
            negative_prompt,
            num_inference_steps,
            guidance_scale,
            guidance_rescale,
            height,
            width,
            num_images_per_prompt,
            image,
            strength,
        )
        tables = self.scheduler.tables(request.steps)
        self._check_timesteps(tables["timesteps"])
        given = self._latents(latents, request.shape)
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        latent_noise, step_noise, image_noise = self._step_noise(seed, request)
        images = self._run(
            request,
            tables,
            latent_noise if given is None else given,
            step_noise,
            image_noise,
            float(guidance_scale),
            callback,
            progress,
        )
        per_prompt = images.shape[0] // len(items)
        groups = [images[i * per_prompt : (i + 1) * per_prompt] for i in range(len(items))]
        if output_type == "np":
            return groups
        from PIL import Image

        return [
            [Image.fromarray(np.round(row * 255).astype(np.uint8)) for row in group]
            for group in groups
        ]

    def _request(
        self, prompt, negative, steps, guidance, rescale, height, width, per_prompt, image, strength
    ) -> _Request:
        prompts = _texts(prompt, "prompt")
        if not isinstance(steps, int) or steps < 1:
            raise InputError(f"num_inference_steps must be a positive int; got {steps!r}")
        if not isinstance(per_prompt, int) or per_prompt < 1:
            raise InputError(f"num_images_per_prompt must be a positive int; got {per_prompt!r}")
        guided = float(guidance) > 1.0
        if not isinstance(rescale, numbers.Real) or not 0 <= rescale <= 1:
            raise InputError(f"guidance_rescale must be a number in [0, 1]; got {rescale!r}")
        if rescale and not guided:
            raise InputError(
                f"guidance_rescale={rescale} rescales classifier-free guidance, which "
                f"guidance_scale={guidance} turns off: give guidance_scale > 1 or no rescale"
            )
        ids = np.repeat(self._tokenize(prompts), per_prompt, axis=0)
        if guided:
            negatives = (
                [""] * len(prompts) if negative is None else _texts(negative, "negative_prompt")
            )
            if len(negatives) != len(prompts):
                raise InputError(
                    f"negative_prompt has {len(negatives)} texts for {len(prompts)} prompts"
                )
            ids = np.concatenate([np.repeat(self._tokenize(negatives), per_prompt, axis=0), ids])
        batch = len(prompts) * per_prompt
        pixels, begin = None, 0
        if image is not None:
            pixels = self._pixels(image, batch, height, width)
            height, width = pixels.shape[2:]
            strength = 0.8 if strength is None else strength
            if not 0 <= strength <= 1:
                raise InputError(f"strength must be in [0, 1]; got {strength!r}")
            run = min(int(steps * strength), steps)
            if run < 1:
                raise InputError(f"strength={strength} of {steps} steps runs no step: raise either")
            begin = steps - run
        elif strength is not None:
            raise InputError("strength is image-to-image's: give image= with it")
        height = self.default_size if height is None else height
        width = self.default_size if width is None else width
        for name, size in (("height", height), ("width", width)):
            if not isinstance(size, int) or size < 1 or size % SIZE_MULTIPLE:
                raise InputError(f"{name} must be a positive multiple of 8; got {size!r}")
        shape = (batch, self.channels, height // self.vae_factor, width // self.vae_factor)
        return _Request(ids, shape, steps, begin, guided, float(rescale), pixels)

    def _tokenize(self, texts: list[str]) -> np.ndarray:
        """Token ids padded (and truncated) to the prompt length, as diffusers tokenizes."""
        rows = []
        for encoding in self.tokenizer.encode_batch(texts):
            ids = list(encoding.ids)
            if len(ids) > self.length:  # keep the end-of-text token, as truncation does
                ids = [*ids[: self.length - 1], ids[-1]]
            rows.append(ids + [self.pad_id] * (self.length - len(ids)))
        return np.asarray(rows, np.int64)

    def _pixels(self, image: Any, batch: int, height, width) -> np.ndarray:
        """Image-to-image's input: one image for every row or one per prompt, as
        [batch, 3, height, width] in [-1, 1] (diffusers' VaeImageProcessor)."""
        from PIL import Image

        if height is not None or width is not None:
            raise InputError("image-to-image keeps the image's size: give no height or width")
        images = [load_image(i) for i in (image if isinstance(image, list) else [image])]
        if batch % len(images):
            raise InputError(f"{len(images)} images do not divide into {batch} rows")
        sizes = {i.size for i in images}
        if len(sizes) > 1:
            raise InputError(f"the images have different sizes {sorted(sizes)}; give one size")
        w, h = sizes.pop()
        w, h = w - w % self.vae_factor, h - h % self.vae_factor
        if min(w, h) < SIZE_MULTIPLE:
            raise InputError(f"the image is {w}x{h}; image-to-image needs at least 8x8")
        arrays = [
            np.asarray(i if i.size == (w, h) else i.resize((w, h), Image.LANCZOS), np.float32)
            for i in images
        ]
        pixels = np.stack(arrays).transpose(0, 3, 1, 2) / 255.0 * 2 - 1
        # Rows follow the prompts' order, each image repeated for its prompt's images.
        return np.repeat(pixels, batch // len(images), axis=0).astype(np.float32)

    def _latents(self, latents: Any, shape: tuple[int, ...]) -> np.ndarray | None:
        if latents is None:
            return None
        array = np.asarray(latents)
        if array.shape != shape or not np.issubdtype(array.dtype, np.floating):
            raise InputError(
                f"latents must be float [batch, channels, height / {self.vae_factor}, "
                f"width / {self.vae_factor}] = {list(shape)}; got {array.dtype} "
                f"{list(array.shape)}"
            )
        return array.astype(np.float32)

    def _check_timesteps(self, timesteps: np.ndarray) -> None:
        spec = self.unet.input_specs["timestep"]
        dtype = getattr(spec, "dtype", np.dtype(np.float32))
        if np.issubdtype(dtype, np.integer) and np.any(timesteps != np.round(timesteps)):
            raise InputError(
                f"{self.repo.source}: the UNet takes integer timesteps and "
                f"{self.scheduler.name} with timestep_spacing "
                f"{self.scheduler.config['timestep_spacing']!r} visits fractional ones: choose "
                "another spacing or scheduler"
            )

    def _step_noise(self, seed: int, request: _Request) -> tuple[Any, Any, Any]:
        """The noise a seed gives: the initial latents, each step's noise (ancestral
        samplers), and the noise of the VAE posterior's sample (image-to-image)."""
        return self._noise(
            jax.random.key(seed),
            shape=request.shape,
            steps=request.steps,
            stochastic=self.scheduler.stochastic,
            encode=request.pixels is not None,
        )

    def _run(self, request, tables, latents, step_noise, image_noise, guidance, callback, progress):
        self._callback = callback
        if callback is None:
            self._bar = progress_bar(request.steps - request.begin, progress)
        report = "callback" if callback is not None else ("bar" if self._bar is not None else None)
        compiled = self.compiles
        what = (
            f"the text-to-image loop: {request.steps - request.begin} steps, latents "
            f"{list(request.shape)}"
        )
        try:
            with slow_compile(lambda: what if self.compiles > compiled else None):
                images = self._program(
                    self._params(request.pixels is not None),
                    request.ids.astype(_dtype(self.text_encoder, "input_ids")),
                    jnp.asarray(latents),
                    step_noise,
                    image_noise,
                    None if request.pixels is None else jnp.asarray(request.pixels),
                    {k: jnp.asarray(_single(v)) for k, v in tables.items()},
                    jnp.float32(self.scheduler.init_noise_sigma(tables)),
                    jnp.float32(guidance),
                    jnp.float32(request.rescale),
                    jnp.int32(request.begin),
                    guided=request.guided,
                    rescaled=request.rescale > 0,
                    report=report,
                    encode=request.pixels is not None,
                )
            return np.asarray(images)
        finally:
            if self._bar is not None:
                self._bar.close()
            self._callback = self._bar = None

    def _params(self, encode: bool) -> dict[str, Any]:
        params = {
            "text_encoder": self.text_encoder.params,
            "unet": self.unet.params,
            "vae_decoder": self.vae_decoder.params,
        }
        if encode:
            params["vae_encoder"] = self.repo.model("vae_encoder").params
        return params

    def _generate(
        self,
        params,
        ids,
        latents,
        step_noise,
        image_noise,
        pixels,
        tables,
        init_sigma,
        guidance,
        rescale,
        begin,
        *,
        guided: bool,
        rescaled: bool,
        report: str | None,
        encode: bool,
    ):
        """(Traced.) Prompt ids -> images [batch, height, width, 3] in [0, 1]: the text
        encoder, the denoising loop from step `begin`, the VAE decoder."""
        self.compiles += 1
        scheduler = self.scheduler
        hidden = transmuter.run(
            self.text_encoder, {"input_ids": ids}, params=params["text_encoder"]
        )["last_hidden_state"]
        if encode:
            sample = scheduler.add_noise(
                tables, begin, self._encode(params["vae_encoder"], pixels, image_noise), latents
            )
        else:
            sample = latents * init_sigma
        steps = tables["timesteps"].shape[0]

        def body(i, state):
            sample, carry = state
            scaled = scheduler.scale(tables, i, sample)
            output = self._unet(params["unet"], scaled, tables["timesteps"][i], hidden, guided)
            if guided:
                unconditional, conditional = jnp.split(output, 2)
                output = unconditional + guidance * (conditional - unconditional)
                if rescaled:
                    output = rescale_guided(output, conditional, rescale)
            noise = step_noise[i] if scheduler.stochastic else None
            sample, carry = scheduler.step(tables, i, begin, output, sample, carry, noise)
            if report is not None:
                jax.debug.callback(self._on_step, i, tables["timesteps"][i], sample)
            return sample, carry

        sample, _ = jax.lax.fori_loop(begin, steps, body, (sample, scheduler.carry(sample)))
        decoded = transmuter.run(
            self.vae_decoder, {"latent_sample": sample / self.scaling}, params=params["vae_decoder"]
        )["sample"]
        return jnp.clip(decoded / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)

    def _unet(self, params, sample, timestep, hidden, guided: bool):
        """(Traced.) The UNet's prediction for the batch (twice over, unconditional rows
        first, under guidance), the timestep in the shape and type its input declares."""
        rows = jnp.concatenate([sample, sample]) if guided else sample
        spec = self.unet.input_specs["timestep"]
        shape = getattr(spec, "shape", None)
        t = timestep.astype(_dtype(self.unet, "timestep"))
        if shape:  # [1] or [batch]; Optimum's current exports take a scalar
            t = jnp.broadcast_to(t, (1 if shape[0] == 1 else rows.shape[0],))
        inputs = {"sample": rows, "timestep": t, "encoder_hidden_states": hidden}
        return transmuter.run(self.unet, inputs, params=params)["out_sample"]

    def _encode(self, params, pixels, noise):
        """(Traced.) Image latents: a sample of the VAE encoder's posterior (its mean and
        log-variance, clamped to [-30, 20] as diffusers does), times the scaling factor."""
        encoder = self.repo.model("vae_encoder")
        out = transmuter.run(encoder, {"sample": pixels}, params=params)
        name = "latent_parameters"
        if name not in out:
            raise ModelLoadError(
                f"{self.repo.source}: vae_encoder/model.onnx gives {encoder.outputs}; "
                "image-to-image reads Optimum's latent_parameters (mean and log-variance)"
            )
        mean, logvar = jnp.split(out[name], 2, axis=1)
        std = jnp.exp(0.5 * jnp.clip(logvar, -30.0, 20.0))
        return (mean + std * noise) * self.scaling

    def _on_step(self, step, timestep, latents) -> None:
        if self._callback is not None:
            self._callback(int(step), float(timestep), np.asarray(latents))
        elif self._bar is not None:
            self._bar.update(1)


def rescale_guided(guided, conditional, rescale):
    """The guided prediction moved toward the conditional one's standard deviation, image by
    image: `rescale` of it scaled by std(conditional) / std(guided), and 1 - `rescale` of it as
    it is (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample Steps are Flawed",
    section 3.4, as diffusers' guidance_rescale applies it)."""
    axes = tuple(range(1, guided.ndim))
    ratio = jnp.std(conditional, axis=axes, keepdims=True) / jnp.std(
        guided, axis=axes, keepdims=True
    )
    return rescale * guided * ratio + (1 - rescale) * guided


def _noise(key, *, shape, steps, stochastic, encode):
    """(Jitted.) The initial latents, per-step noise (None unless stochastic) and the VAE
    posterior's noise (None unless encoding) drawn from one key."""
    first, per_step, posterior = jax.random.split(key, 3)
    return (
        jax.random.normal(first, shape, jnp.float32),
        jax.random.normal(per_step, (steps, *shape), jnp.float32) if stochastic else None,
        jax.random.normal(posterior, shape, jnp.float32) if encode else None,
    )


def _single(table: np.ndarray) -> np.ndarray:
    """A float64 host table as float32, the latents' type."""
    return table.astype(np.float32) if table.dtype == np.float64 else table


def _texts(value: Any, name: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if (
        not isinstance(texts, (list, tuple))
        or not texts
        or not all(isinstance(t, str) for t in texts)
    ):
        raise InputError(f"{name} must be a string or a non-empty list of strings; got {value!r}")
    return list(texts)


def _dtype(model: transmuter.Model, name: str) -> np.dtype:
    spec = model.input_specs[name]
    return np.dtype(getattr(spec, "dtype", np.float32))
