"""Diffusion schedulers as array code, for a sampling loop compiled as one program.

Written from the algorithms diffusers documents for its schedulers (Euler discrete, Euler
ancestral, DDIM, DPM-Solver++ 2M), built from a repo's scheduler/scheduler_config.json or a name.
What depends only on the configuration and the step count (the timesteps, sigmas, alphas) is
computed on the host with numpy in float64, once per step count, as `tables`; what depends on
the sample (`scale`, `step`, `add_noise`) is jax.numpy, indexed by a step number that may be a
traced loop counter. A setting this module does not implement is a ModelLoadError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from transmuter.errors import ModelLoadError

# The settings the schedulers share, with diffusers' defaults. A class adds its own below.
COMMON = {
    "num_train_timesteps": 1000,
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "trained_betas": None,
    "prediction_type": "epsilon",
    "timestep_spacing": "linspace",
    "steps_offset": 0,
}
SPACINGS = ("linspace", "leading", "trailing")
PREDICTIONS = ("epsilon", "v_prediction")
# Settings with one supported value: anything else is refused by name.
FIXED = {
    "rescale_betas_zero_snr": False,
    "thresholding": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "use_lu_lambdas": False,
    "use_flow_sigmas": False,
    "use_dynamic_shifting": False,
    "interpolation_type": "linear",
    "timestep_type": "discrete",
    "variance_type": None,
    "algorithm_type": "dpmsolver++",
    "solver_type": "midpoint",
    "solver_order": 2,
}


@dataclass(frozen=True)
class Scheduler:
    """A scheduler's settings (`config`: the class's keys, defaults filled in). `tables(steps)`
    gives the per-step arrays the traced methods read; `carry(sample)` the state a step passes
    to the next (DPM-Solver's previous prediction)."""

    config: Mapping[str, Any]
    names: ClassVar[tuple[str, ...]] = ()
    own: ClassVar[dict[str, Any]] = {}
    # Whether each step adds fresh noise (step() then takes a noise array).
    stochastic: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.names[0]

    def alphas_cumprod(self) -> np.ndarray:
        """The training schedule's cumulative product of (1 - beta), float64."""
        c = self.config
        count = c["num_train_timesteps"]
        if c["trained_betas"] is not None:
            betas = np.asarray(c["trained_betas"], np.float64)
        elif c["beta_schedule"] == "linear":
            betas = np.linspace(c["beta_start"], c["beta_end"], count)
        elif c["beta_schedule"] == "scaled_linear":
            betas = np.linspace(c["beta_start"] ** 0.5, c["beta_end"] ** 0.5, count) ** 2
        elif c["beta_schedule"] == "squaredcos_cap_v2":
            # Nichol & Dhariwal's cosine schedule, each beta capped at 0.999.
            def alpha_bar(t):
                return np.cos((t + 0.008) / 1.008 * np.pi / 2) ** 2

            t = np.arange(count) / count
            betas = np.minimum(1 - alpha_bar(t + 1 / count) / alpha_bar(t), 0.999)
        else:
            raise ModelLoadError(
                f"{self.name}: beta_schedule {c['beta_schedule']!r} is not supported; it is one "
                "of 'linear', 'scaled_linear', 'squaredcos_cap_v2'"
            )
        return np.cumprod(1.0 - betas)

    def timesteps(self, steps: int) -> np.ndarray:
        """The training timesteps the `steps` inference steps visit, first (noisiest) first."""
        c = self.config
        count, spacing = c["num_train_timesteps"], c["timestep_spacing"]
        if spacing == "linspace":
            return np.linspace(0, count - 1, steps)[::-1].copy()
        if spacing == "leading":
            return (np.arange(steps) * (count // steps)).round()[::-1] + c["steps_offset"]
        return np.arange(count, 0, -count / steps).round() - 1  # trailing

    def tables(self, steps: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def init_noise_sigma(self, tables: Mapping[str, np.ndarray]) -> float:
        """The scale of the initial noise (pure noise latents are drawn as N(0, 1) times this)."""
        return 1.0

    def scale(self, tables, i, sample):
        """The UNet's input at step i (Euler's samplers divide by sqrt(sigma^2 + 1))."""
        return sample

    def carry(self, sample) -> Any:
        return ()

    def step(self, tables, i, begin, output, sample, carry, noise=None):
        """(sample after step i, carry) from the UNet's output at step i; `begin` is the first
        step run (image-to-image starts part way)."""
        raise NotImplementedError

    def add_noise(self, tables, i, sample, noise):
        """`sample` noised to the level of step i: image-to-image's starting point."""
        raise NotImplementedError


def _sigmas(alphas_cumprod: np.ndarray, timesteps: np.ndarray, final: str) -> np.ndarray:
    """Karras sigmas (sqrt((1 - a) / a)) at the timesteps, interpolated linearly between
    training steps, followed by the final sigma ("zero", or "sigma_min": the smallest trained)."""
    trained = np.sqrt((1 - alphas_cumprod) / alphas_cumprod)
    sigmas = np.interp(timesteps, np.arange(len(trained)), trained)
    last = 0.0 if final == "zero" else trained[0]
    return np.concatenate([sigmas, [last]])


def _predicted_original(prediction: str, output, sample, sigma):
    """x0 predicted from the UNet's output on the sigma-scaled sample (Euler's parameterization)."""
    if prediction == "epsilon":
        return sample - sigma * output
    return output * (-sigma / jnp.sqrt(sigma**2 + 1)) + sample / (sigma**2 + 1)  # v_prediction


class EulerDiscrete(Scheduler):
    """Euler's method on the probability-flow ODE in sigma (Karras et al. 2022, Algorithm 2
    without churn: diffusers' pipelines pass none)."""

    names = ("EulerDiscreteScheduler", "euler")
    own = {"final_sigmas_type": "zero"}

    def tables(self, steps):
        timesteps = self.timesteps(steps)
        sigmas = _sigmas(self.alphas_cumprod(), timesteps, self.config["final_sigmas_type"])
        return {"timesteps": timesteps, "sigmas": sigmas}

    def init_noise_sigma(self, tables):
        largest = float(np.max(tables["sigmas"]))
        if self.config["timestep_spacing"] in ("linspace", "trailing"):
            return largest
        return (largest**2 + 1) ** 0.5

    def scale(self, tables, i, sample):
        return sample / jnp.sqrt(tables["sigmas"][i] ** 2 + 1)

    def step(self, tables, i, begin, output, sample, carry, noise=None):
        sigma, after = tables["sigmas"][i], tables["sigmas"][i + 1]
        original = _predicted_original(self.config["prediction_type"], output, sample, sigma)
        derivative = (sample - original) / sigma
        return sample + derivative * (after - sigma), carry

    def add_noise(self, tables, i, sample, noise):
        return sample + noise * tables["sigmas"][i]


class EulerAncestral(EulerDiscrete):
    """Euler steps down to sigma_down, then fresh noise of sigma_up: together they land on the
    next sigma's noise level (k-diffusion's ancestral sampler, eta 1)."""

    names = ("EulerAncestralDiscreteScheduler", "euler_a")
    own = {}
    stochastic = True

    def tables(self, steps):
        timesteps = self.timesteps(steps)
        return {"timesteps": timesteps, "sigmas": _sigmas(self.alphas_cumprod(), timesteps, "zero")}

    def step(self, tables, i, begin, output, sample, carry, noise=None):
        sigma, after = tables["sigmas"][i], tables["sigmas"][i + 1]
        up = jnp.sqrt(after**2 * (sigma**2 - after**2) / sigma**2)
        down = jnp.sqrt(after**2 - up**2)
        original = _predicted_original(self.config["prediction_type"], output, sample, sigma)
        derivative = (sample - original) / sigma
        return sample + derivative * (down - sigma) + noise * up, carry


class DDIM(Scheduler):
    """Song et al.'s DDIM with eta 0 (deterministic), as diffusers' Stable Diffusion pipelines
    run it. The previous timestep is always t - num_train_timesteps // steps, whatever the
    spacing (as diffusers computes it)."""

    names = ("DDIMScheduler", "ddim")
    own = {
        "clip_sample": True,
        "clip_sample_range": 1.0,
        "set_alpha_to_one": True,
        "timestep_spacing": "leading",
    }

    def timesteps(self, steps):
        # DDIM rounds linspace timesteps to integers (Euler keeps them fractional).
        timesteps = super().timesteps(steps)
        return timesteps.round() if self.config["timestep_spacing"] == "linspace" else timesteps

    def tables(self, steps):
        alphas = self.alphas_cumprod()
        timesteps = self.timesteps(steps)
        previous = timesteps - self.config["num_train_timesteps"] // steps
        final = 1.0 if self.config["set_alpha_to_one"] else alphas[0]
        before = np.where(previous >= 0, alphas[np.maximum(previous, 0).astype(int)], final)
        return {
            "timesteps": timesteps,
            "alpha": alphas[timesteps.astype(int)],
            "alpha_previous": before,
        }

    def step(self, tables, i, begin, output, sample, carry, noise=None):
        alpha, before = tables["alpha"][i], tables["alpha_previous"][i]
        if self.config["prediction_type"] == "epsilon":
            original = (sample - jnp.sqrt(1 - alpha) * output) / jnp.sqrt(alpha)
            epsilon = output
        else:  # v_prediction
            original = jnp.sqrt(alpha) * sample - jnp.sqrt(1 - alpha) * output
            epsilon = jnp.sqrt(alpha) * output + jnp.sqrt(1 - alpha) * sample
        if self.config["clip_sample"]:
            bound = self.config["clip_sample_range"]
            original = jnp.clip(original, -bound, bound)
        return jnp.sqrt(before) * original + jnp.sqrt(1 - before) * epsilon, carry

    def add_noise(self, tables, i, sample, noise):
        alpha = tables["alpha"][i]
        return jnp.sqrt(alpha) * sample + jnp.sqrt(1 - alpha) * noise


class DPMSolverMultistep(Scheduler):
    """DPM-Solver++ (Lu et al. 2022), second-order multistep with the midpoint update ("2M"):
    each step predicts x0 and extrapolates from this step's and the previous step's
    predictions in log-SNR (lambda). The first step run, and the last, are first order."""

    names = ("DPMSolverMultistepScheduler", "dpm++2m")
    own = {
        "lower_order_final": True,
        "euler_at_final": False,
        "final_sigmas_type": "zero",
        "lambda_min_clipped": -float("inf"),
    }

    def timesteps(self, steps):
        c = self.config
        count, spacing = c["num_train_timesteps"], c["timestep_spacing"]
        alphas = self.alphas_cumprod()
        lambdas = 0.5 * np.log(alphas) - 0.5 * np.log(1 - alphas)
        # Timesteps whose log-SNR falls below lambda_min_clipped are never visited.
        last = count - int(np.searchsorted(lambdas[::-1], c["lambda_min_clipped"]))
        if spacing == "linspace":
            return np.linspace(0, last - 1, steps + 1).round()[::-1][:-1].copy()
        if spacing == "leading":
            ratio = last // (steps + 1)
            return (np.arange(steps + 1) * ratio).round()[::-1][:-1] + c["steps_offset"]
        return np.arange(last, 0, -count / steps).round() - 1  # trailing

    def tables(self, steps):
        c = self.config
        timesteps = self.timesteps(steps)
        sigmas = _sigmas(self.alphas_cumprod(), timesteps, c["final_sigmas_type"])
        alpha = 1 / np.sqrt(sigmas**2 + 1)
        sigma = sigmas * alpha
        with np.errstate(divide="ignore"):
            lambdas = np.log(alpha) - np.log(sigma)  # +inf at a final sigma of zero
        final_first = c["euler_at_final"] or (c["lower_order_final"] and steps < 15)
        final_first = final_first or c["final_sigmas_type"] == "zero"
        first = np.zeros(steps, bool)
        first[-1] = final_first
        return {
            "timesteps": timesteps,
            "alpha": alpha,
            "sigma": sigma,
            "lambda": lambdas,
            "first_order": first,
        }

    def carry(self, sample):
        return jnp.zeros_like(sample)  # the previous step's x0 prediction

    def step(self, tables, i, begin, output, sample, carry, noise=None):
        alpha, sigma, lam = tables["alpha"], tables["sigma"], tables["lambda"]
        if self.config["prediction_type"] == "epsilon":
            original = (sample - sigma[i] * output) / alpha[i]
        else:  # v_prediction
            original = alpha[i] * sample - sigma[i] * output
        h = lam[i + 1] - lam[i]
        # exp(-h) - 1 with h = +inf (a final sigma of zero) is -1: the step lands on x0.
        decay = jnp.expm1(-h)
        first = sigma[i + 1] / sigma[i] * sample - alpha[i + 1] * decay * original
        previous = jnp.maximum(i - 1, 0)
        ratio = (lam[i] - lam[previous]) / h
        slope = (original - carry) / ratio
        second = first - 0.5 * alpha[i + 1] * decay * slope
        use_first = (i == begin) | tables["first_order"][i]
        return jnp.where(use_first, first, second), original

    def add_noise(self, tables, i, sample, noise):
        return tables["alpha"][i] * sample + tables["sigma"][i] * noise


SCHEDULERS = (EulerDiscrete, EulerAncestral, DDIM, DPMSolverMultistep)
BY_NAME = {name: kind for kind in SCHEDULERS for name in kind.names}


def make_scheduler(config: Mapping[str, Any], name: str | None = None) -> Scheduler:
    """The scheduler of `config` (scheduler_config.json's contents), or of class `name` (a
    diffusers class name or an alias: "euler", "euler_a", "ddim", "dpm++2m") built from
    config's settings as diffusers' `from_config` does: the keys that class has, its defaults
    for the rest."""
    chosen = name if name is not None else config.get("_class_name")
    if chosen not in BY_NAME:
        given = "scheduler=" if name is not None else "scheduler_config.json's _class_name"
        raise ModelLoadError(
            f"{given} {chosen!r} is not a supported scheduler; give scheduler= one of "
            f"{', '.join(BY_NAME)}"
        )
    kind = BY_NAME[chosen]
    defaults = {**COMMON, **kind.own}
    settings = {key: config.get(key, default) for key, default in defaults.items()}
    _check(kind, settings, config)
    return kind(settings)


def _check(kind: type[Scheduler], settings: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Refuse, by name, a setting that kind's diffusers class has and this module lacks."""
    name = kind.names[0]
    fixed = {k: v for k, v in FIXED.items() if k in config and config[k] != v}
    applies = _keys_of(kind)
    for key, value in fixed.items():
        if key in applies:
            raise ModelLoadError(f"{name}: {key}={config[key]!r} is not supported (only {value!r})")
    if settings["prediction_type"] not in PREDICTIONS:
        raise ModelLoadError(
            f"{name}: prediction_type {settings['prediction_type']!r} is not supported; it is "
            f"one of {', '.join(PREDICTIONS)}"
        )
    if settings["timestep_spacing"] not in SPACINGS:
        raise ModelLoadError(
            f"{name}: timestep_spacing {settings['timestep_spacing']!r} is not supported; it is "
            f"one of {', '.join(SPACINGS)}"
        )
    final = settings.get("final_sigmas_type", "zero")
    if final not in ("zero", "sigma_min"):
        raise ModelLoadError(f"{name}: final_sigmas_type {final!r} is not 'zero' or 'sigma_min'")


def _keys_of(kind: type[Scheduler]) -> set[str]:
    """The FIXED settings diffusers' class of that name reads."""
    shared = {"rescale_betas_zero_snr"}
    per_class = {
        EulerDiscrete: {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"}
        | {"interpolation_type", "timestep_type"},
        EulerAncestral: set(),
        DDIM: {"thresholding"},
        DPMSolverMultistep: {"thresholding", "use_karras_sigmas", "use_exponential_sigmas"}
        | {"use_beta_sigmas", "use_lu_lambdas", "use_flow_sigmas", "use_dynamic_shifting"}
        | {"variance_type", "algorithm_type", "solver_type", "solver_order"},
    }
    return shared | per_class[kind]
