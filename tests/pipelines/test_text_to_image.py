"""text-to-image: the tiny Stable Diffusion repo against diffusers' StableDiffusionPipeline and
its img2img pipeline (tests/fixtures/make_diffusion.py), latents after every step and images.

Each case compiles one program (the whole loop), about half a minute on a busy CPU: the fast
tests share one (Euler, 4 steps, 16 x 16, one image, guided, with a callback); every other
scheduler, size, batch and image-to-image is marked slow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPOS
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)
from PIL import Image

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.diffusion import text_to_image
from transmuter.pipelines.diffusion.text_to_image import load_diffusion_repo

REPO = REPOS / "tiny-sd"
CASES = {case["name"]: case for case in json.loads((REPO / "expected.json").read_text())["cases"]}
STEP_TOLERANCE = 1e-4
IMAGE_TOLERANCE = 1e-3  # of the pixel range [0, 1]


@pytest.fixture(scope="module")
def arrays():
    with np.load(REPO / "expected.npz") as data:
        return dict(data)


@pytest.fixture(scope="module")
def repo():
    return load_diffusion_repo(REPO)


@pytest.fixture(scope="module")
def euler():
    return transmuter.pipeline("text-to-image", REPO)  # the folder: pipeline() reads its layout


def generate(pipe, name, arrays, **more):
    """Run the pipeline on a case as diffusers ran it: the images and the latents per step."""
    case = CASES[name]
    options = {
        k: case[k]
        for k in ("negative_prompt", "guidance_scale", "guidance_rescale", "num_images_per_prompt")
        if k in case
    }
    if "strength" in case:
        options.update(image=arrays[f"{name}/image"], strength=case["strength"])
    else:
        options.update(height=case["height"], width=case["width"])
    steps = []
    images = pipe(
        case["prompt"],
        num_inference_steps=case["num_inference_steps"],
        latents=arrays[f"{name}/latents"],
        output_type="np",
        callback=lambda step, timestep, latents: steps.append(latents),
        **{**options, **more},
    )
    # A list of prompts gives each prompt's images; diffusers' are one batch.
    return np.concatenate(images) if isinstance(case["prompt"], list) else images, np.stack(steps)


def check(pipe, name, arrays):
    images, steps = generate(pipe, name, arrays)
    np.testing.assert_allclose(steps, arrays[f"{name}/steps"], atol=STEP_TOLERANCE, rtol=0)
    np.testing.assert_allclose(images, arrays[f"{name}/images"], atol=IMAGE_TOLERANCE, rtol=0)


def test_euler_matches_diffusers_step_by_step(euler, arrays):
    check(euler, "euler", arrays)
    assert euler.compiles == 1


def test_a_seed_gives_the_same_images_and_the_program_is_reused(euler):
    seen = []

    def run(seed):
        return euler(
            "a cat",
            num_inference_steps=4,
            height=16,
            width=16,
            seed=seed,
            callback=lambda step, timestep, latents: seen.append((step, timestep)),
        )

    first, again, other = run(7), run(7), run(8)
    assert len(first) == 1 and isinstance(first[0], Image.Image) and first[0].size == (16, 16)
    assert np.array_equal(np.asarray(first[0]), np.asarray(again[0]))
    assert not np.array_equal(np.asarray(first[0]), np.asarray(other[0]))
    # Euler with Stable Diffusion's leading spacing and steps_offset 1, four steps.
    assert seen[:4] == [(0, 751.0), (1, 501.0), (2, 251.0), (3, 1.0)]
    assert euler.compiles == 1  # the shape, steps and mode of the first test


def test_a_generator_of_prompts_gives_one_result_per_prompt(euler):
    options = dict(num_inference_steps=4, height=16, width=16, seed=7, callback=lambda *_: None)
    out = euler((p for p in ["a cat", "a dog"]), **options)  # test_a_seed's program, per prompt
    assert not isinstance(out, list)
    results = list(out)
    assert [len(r) for r in results] == [1, 1]
    assert np.array_equal(np.asarray(results[0][0]), np.asarray(euler("a cat", **options)[0]))
    assert euler.compiles == 1


def test_the_tokenizer_from_vocab_and_merges(repo, tmp_path):
    shutil.copytree(REPO / "tokenizer", tmp_path / "tokenizer")
    (tmp_path / "tokenizer" / "tokenizer.json").unlink()
    for name in ("model_index.json", "scheduler"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, tmp_path / name)
    bpe = load_diffusion_repo(tmp_path).tokenizer
    for case in CASES.values():
        prompts = case["prompt"] if isinstance(case["prompt"], list) else [case["prompt"]]
        for prompt, ids in zip(prompts, case["ids"]):
            # The pad tail is the pipeline's; the tokens before it are the tokenizer's.
            assert bpe.encode(prompt).ids == ids[: len(bpe.encode(prompt).ids)]
            assert repo.tokenizer.encode(prompt).ids == bpe.encode(prompt).ids


def test_long_prompts_are_truncated_to_the_encoder_length(euler):
    ids = euler._tokenize(["a red cube " * 20])
    assert ids.shape == (1, 16) and ids[0, -1] == euler.tokenizer.token_to_id("<|endoftext|>")


def test_bad_inputs_say_what_was_expected(euler):
    with pytest.raises(InputError, match="height must be a positive multiple of 8; got 30"):
        euler("a cat", height=30)
    with pytest.raises(InputError, match=r"latents must be float .* = \[1, 4, 16, 16\]"):
        euler("a cat", latents=np.zeros((1, 4, 8, 8), np.float32))
    with pytest.raises(InputError, match="output_type must be one of pil, np; got 'pt'"):
        euler("a cat", output_type="pt")
    with pytest.raises(InputError, match="strength is image-to-image's"):
        euler("a cat", strength=0.5)
    with pytest.raises(InputError, match="negative_prompt has 2 texts for 1 prompts"):
        euler("a cat", negative_prompt=["x", "y"])
    with pytest.raises(InputError, match="a list of prompts or a generator of them: got an empty"):
        euler([])
    with pytest.raises(InputError, match=r"guidance_rescale must be a number in \[0, 1\]"):
        euler("a cat", guidance_rescale=1.5)
    with pytest.raises(InputError, match="guidance_scale=1.0 turns off"):
        euler("a cat", guidance_scale=1.0, guidance_rescale=0.5)
    with pytest.raises(InputError, match="runs no step"):
        euler("a cat", image=np.zeros((32, 32, 3), np.uint8), strength=0.1, num_inference_steps=4)


def test_schedulers_refuse_what_they_do_not_implement(repo):
    def with_config(**settings):
        return dataclasses.replace(repo, scheduler_config={**repo.scheduler_config, **settings})

    with pytest.raises(ModelLoadError, match="'PNDMScheduler' is not a supported scheduler"):
        transmuter.pipeline("text-to-image", with_config(_class_name="PNDMScheduler"))
    with pytest.raises(ModelLoadError, match="use_karras_sigmas=True is not supported"):
        transmuter.pipeline("text-to-image", with_config(use_karras_sigmas=True))
    with pytest.raises(ModelLoadError, match="prediction_type 'sample' is not supported"):
        transmuter.pipeline("text-to-image", with_config(prediction_type="sample"))
    with pytest.raises(ModelLoadError, match="solver_order=3 is not supported"):
        transmuter.pipeline("text-to-image", with_config(solver_order=3), scheduler="dpm++2m")
    with pytest.raises(ModelLoadError, match="scheduler= 'heun' is not a supported scheduler"):
        transmuter.pipeline("text-to-image", repo, scheduler="heun")
    # A PNDM config (Stable Diffusion 1.5's) runs with a scheduler named, as from_config does.
    pipe = transmuter.pipeline(
        "text-to-image", with_config(_class_name="PNDMScheduler"), scheduler="DDIMScheduler"
    )
    assert pipe.scheduler.name == "DDIMScheduler"


def test_a_repo_without_its_models_says_which(tmp_path):
    for name in ("model_index.json", "scheduler", "tokenizer", "text_encoder"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, tmp_path / name)
    with pytest.raises(ModelLoadError, match="has no unet/model.onnx"):
        transmuter.pipeline("text-to-image", load_diffusion_repo(tmp_path))
    with pytest.raises(ModelLoadError, match="has no model_index.json"):
        load_diffusion_repo(tmp_path / "text_encoder")
    with pytest.raises(ModelLoadError, match="reads a diffusers repo"):
        transmuter.pipeline("text-to-image", transmuter.load_repo(REPOS / "bert"))


def test_a_hub_repo_loads_its_subfolders_at_one_commit(hub, repo):  # noqa: F811
    files = {
        p.relative_to(REPO).as_posix(): p.read_bytes()
        for p in REPO.rglob("*")
        if p.is_file() and not p.name.startswith("expected")
    }
    commit = hub.publish("org/tiny-sd", files)
    remote = transmuter.pipeline("text-to-image", f"hf://org/tiny-sd@{commit}").repo
    assert set(remote.onnx) == {"text_encoder", "unet", "vae_decoder", "vae_encoder"}
    assert f"snapshots/{commit}/unet/model.onnx" in remote.onnx["unet"].as_posix()
    assert remote.scheduler_config == repo.scheduler_config
    assert remote.configs["unet"]["sample_size"] == 16
    # The snapshot's UNet is the folder's file, and loads to the same weights (the folder's
    # runs in every test above; a run of each would compile the UNet twice).
    assert remote.onnx["unet"].read_bytes() == repo.onnx["unet"].read_bytes()
    here, there = repo.model("unet"), remote.model("unet")
    assert (there.inputs, there.outputs) == (here.inputs, here.outputs)
    assert list(there.params) == list(here.params)
    for name, value in here.params.items():
        np.testing.assert_array_equal(np.asarray(there.params[name]), np.asarray(value))


# The "dpm" case (DPM-Solver++ 2M, guided, from pure noise) is "no-guidance"'s steps with
# "euler"'s guidance; "img2img-dpm" runs DPM-Solver++ guided too.
@pytest.mark.slow
def test_ddim_matches_diffusers(repo, arrays):
    check(transmuter.pipeline("text-to-image", repo, scheduler="ddim"), "ddim", arrays)


@pytest.mark.slow
def test_euler_ancestral_with_diffusers_per_step_noise(repo, arrays, monkeypatch):
    pipe = transmuter.pipeline("text-to-image", repo, scheduler="euler_a")
    drawn = pipe._step_noise

    def recorded(seed, request):
        latents, _, posterior = drawn(seed, request)
        return latents, jnp.asarray(arrays["euler_a/step_noise"]), posterior

    monkeypatch.setattr(pipe, "_step_noise", recorded)
    check(pipe, "euler_a", arrays)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddim-v-trailing", "euler-linspace-v"])
def test_v_prediction_and_spacings(repo, arrays, name):
    case = CASES[name]
    changed = dataclasses.replace(
        repo, scheduler_config={**repo.scheduler_config, **case["scheduler_config"]}
    )
    check(transmuter.pipeline("text-to-image", changed, scheduler=case["scheduler"]), name, arrays)


@pytest.mark.slow
def test_a_batch_of_prompts_with_negatives_at_another_aspect_ratio(euler, arrays):
    check(euler, "batch", arrays)
    images = euler(["a cat", "a red cube"], height=24, width=40, num_images_per_prompt=2, seed=1)
    # One result per prompt, holding its images.
    assert [[i.size for i in group] for group in images] == [[(40, 24)] * 2] * 2


@pytest.mark.slow
def test_guidance_rescale_matches_diffusers(euler, arrays):
    check(euler, "rescaled", arrays)
    # Unrescaled, the same latents end elsewhere: the check above sees the rescale.
    plain, _ = generate(euler, "rescaled", arrays, guidance_rescale=0.0)
    assert np.abs(plain - arrays["rescaled/images"]).max() > 10 * IMAGE_TOLERANCE


@pytest.mark.slow
def test_without_guidance_the_batch_is_one(repo, arrays):
    check(transmuter.pipeline("text-to-image", repo, scheduler="dpm++2m"), "no-guidance", arrays)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["img2img", "img2img-dpm"])
def test_image_to_image_matches_diffusers(repo, arrays, name):
    pipe = transmuter.pipeline("text-to-image", repo, scheduler=CASES[name]["scheduler"])
    check(pipe, name, arrays)


def test_progress_and_the_compile_notice(repo, capsys, monkeypatch):
    """progress=True shows a bar of the steps, counted from inside the one program; a call
    that compiles says what on stderr if it runs past the notice's limit, and a cached
    program's call says nothing."""
    said = []

    @contextlib.contextmanager
    def recording(describe, after=None):
        yield
        said.append(describe())

    monkeypatch.setattr(text_to_image, "slow_compile", recording)
    pipe = transmuter.pipeline("text-to-image", repo)
    options = dict(num_inference_steps=3, height=16, width=16, seed=3, output_type="np")
    shown = pipe("a cat", progress=True, **options)
    assert "3/3" in capsys.readouterr().err
    again = pipe("a cat", progress=True, **options)
    assert "3/3" in capsys.readouterr().err
    assert said == ["the text-to-image loop: 3 steps, latents [1, 4, 8, 8]", None]
    quiet = pipe("a cat", progress=False, **options)
    assert "3/3" not in capsys.readouterr().err
    np.testing.assert_array_equal(shown[0], again[0])
    np.testing.assert_allclose(shown[0], quiet[0], atol=1e-6)  # the bar changes nothing
    with pytest.raises(InputError, match="progress must be True, False or None"):
        pipe("a cat", progress="yes", **options)
