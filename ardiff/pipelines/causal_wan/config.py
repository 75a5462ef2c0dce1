"""The causal-Wan pipeline's arguments, and the model shapes read from the model configs.

    model_dir/                      (the diffusers layout of Wan2.1-T2V; Wan's: layouts.py)
      transformer/config.json       read here, with the json module only
      vae/config.json               read here, with the json module only
      transformer/*.safetensors, vae/, text_encoder/, tokenizer/   read by `load()`

Construction reads the two config files (layouts.py: in Wan's layout, config.json and
the VAE's tensor shapes) and nothing else, so `inspect-spec` needs no
weights and no diffusers. Every shape of the KV spec comes from them and the resolution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ardiff.dtypes import DTYPE_BYTES
from ardiff.errors import ConfigError, PipelineLoadError
from ardiff.pipelines.causal_wan.layouts import (
    DIFFUSERS,
    detect_layout,
    transformer_config,
    vae_config,
)
from ardiff.pipelines.causal_wan.presets import Preset, get_preset

TEXT_ENCODER_DEVICES = r"auto|cpu|cuda(:[0-9]+)?"
DEFAULT_ROPE_FRAMES = 1024  # diffusers' rope_max_seq_len default: rows of the rotary tables


def _require(config: dict[str, Any], key: str, path: Path) -> Any:
    if key not in config:
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} has no key {key!r}; "
                                f"is it a WanTransformer3DModel / AutoencoderKLWan config?")
    return config[key]


@dataclass(frozen=True)
class TransformerShape:
    """What the KV spec needs of `WanTransformer3DModel`'s config."""

    num_layers: int
    num_heads: int
    head_size: int
    in_channels: int
    patch_size: tuple[int, int, int]
    rope_frames: int

    @classmethod
    def read(cls, model_dir: Path, layout: str = DIFFUSERS) -> TransformerShape:
        config, path = transformer_config(model_dir, layout)
        for key in ("image_dim", "added_kv_proj_dim"):
            if config.get(key) is not None:
                raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} sets {key}="
                                        f"{config[key]!r} (an image-to-video model); causal-wan "
                                        f"runs text-to-video transformers only")
        return cls(num_layers=_require(config, "num_layers", path),
                   num_heads=_require(config, "num_attention_heads", path),
                   head_size=_require(config, "attention_head_dim", path),
                   in_channels=_require(config, "in_channels", path),
                   patch_size=tuple(_require(config, "patch_size", path)),
                   rope_frames=config.get("rope_max_seq_len", DEFAULT_ROPE_FRAMES))


@dataclass(frozen=True)
class VaeShape:
    """What the spec and the decode cache need of `AutoencoderKLWan`'s (Wan2.1) config."""

    z_dim: int
    base_dim: int
    dim_mult: tuple[int, ...]
    num_res_blocks: int
    temporal_downsample: tuple[bool, ...]

    @classmethod
    def read(cls, model_dir: Path, layout: str = DIFFUSERS) -> VaeShape:
        config, path = vae_config(model_dir, layout)
        if config.get("is_residual") or config.get("patch_size") is not None:
            raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} is a Wan2.2 VAE "
                                    f"(is_residual / patch_size set); causal-wan decodes with "
                                    f"the Wan2.1 VAE")
        return cls(z_dim=_require(config, "z_dim", path),
                   base_dim=config.get("decoder_base_dim") or _require(config, "base_dim", path),
                   dim_mult=tuple(_require(config, "dim_mult", path)),
                   num_res_blocks=_require(config, "num_res_blocks", path),
                   temporal_downsample=tuple(_require(config, "temperal_downsample", path)))

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent row/column: one 2x resample per stage after the first (8)."""
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        """Video frames per latent frame after the first (4); the first gives 1."""
        return 2 ** sum(self.temporal_downsample)


@dataclass(frozen=True)
class CausalWanConfig:
    """The pipeline arguments, validated, with the model shapes they point at."""

    model_dir: Path
    layout: str  # layouts.DIFFUSERS or layouts.WAN: which folder layout model_dir has
    preset: Preset
    transformer: TransformerShape
    vae: VaeShape
    height: int
    width: int
    frames_per_block: int
    window_frames: int
    sink_frames: int
    text_len: int
    denoising_steps: tuple[int, ...]
    use_ema: bool
    generator_ckpt: Path | None
    lora_ckpt: Path | None
    lora_alpha: float | None
    cfg: bool
    vae_dtype: str
    session_capacity: int
    text_encoder_device: str = "auto"

    @property
    def latent_height(self) -> int:
        return self.height // self.vae.spatial_factor

    @property
    def latent_width(self) -> int:
        return self.width // self.vae.spatial_factor

    @property
    def token_grid(self) -> tuple[int, int]:
        """Patches per latent frame, (rows, columns)."""
        _, ph, pw = self.transformer.patch_size
        return self.latent_height // ph, self.latent_width // pw

    @property
    def tokens_per_frame(self) -> int:
        rows, cols = self.token_grid
        return rows * cols

    @property
    def latent_shape(self) -> tuple[int, int, int, int, int]:
        """One block's latents: [1, channels, frames_per_block, h, w]."""
        return (1, self.transformer.in_channels, self.frames_per_block, self.latent_height,
                self.latent_width)

    @property
    def branch_names(self) -> tuple[str, ...]:
        return ("positive", "negative") if self.cfg else ("main",)

    def timesteps(self) -> list[float]:
        return self.preset.timesteps(self.denoising_steps)


def build_config(model_dir: str, generator_ckpt: str | None = None, use_ema: bool | None = None,
                 lora_ckpt: str | None = None, lora_alpha: float | None = None,
                 height: int = 480, width: int = 832, preset: str = "self-forcing",
                 frames_per_block: int = 3, window_frames: int | None = None,
                 sink_frames: int | None = None, text_len: int = 512,
                 denoising_steps: list[int] | None = None, cfg: bool = False,
                 vae_dtype: str = "bfloat16", session_capacity: int = 4,
                 shift: float | None = None, warp: bool | None = None,
                 text_encoder_device: str = "auto") -> CausalWanConfig:
    """Validate the pipeline arguments and read the shapes; raises one-line typed errors.

        model_dir         Wan2.1-T2V in the Diffusers layout (transformer/, vae/,
                          text_encoder/, tokenizer/) or Wan's own (layouts.py); relative
                          paths are relative to the working directory
        generator_ckpt    a Self-Forcing / CausVid / LongLive `.pt` applied over transformer/
        use_ema           read its `generator_ema` (else `generator`); default: the preset's
        lora_ckpt         a LongLive LoRA merged at load; lora_alpha: default its rank
        height, width     video pixels, multiples of 16
        preset            self-forcing | causvid | longlive (presets.py)
        frames_per_block  latent frames per AR block
        window_frames, sink_frames   default: the preset's (window counts the block itself)
        text_len          prompt tokens (Wan: 512)
        denoising_steps   replace the preset's steps (same scale: warped if the preset warps)
        shift, warp       replace the preset's flow shift / whether its steps are warped
                          (CausVid's warped 4-step: preset causvid, warp true, steps
                          1000 750 500 250)
        cfg               declare positive / negative branches for guidance_scale > 1
        vae_dtype         the VAE's dtype, in which its decode cache is sized
        session_capacity  the spec's upper bound on resident sessions
        text_encoder_device  auto | cpu | cuda | cuda:N: where UMT5 runs; auto: the run
                          device if every model, the KV plan and ardiff's activation margin
                          fit its memory there, else cpu (pipeline.place_weights)
    """
    recipe = get_preset(preset).adjusted(shift=shift, warp=warp)
    root = _arg_path(model_dir)
    layout = detect_layout(root)
    transformer, vae = TransformerShape.read(root, layout), VaeShape.read(root, layout)
    config = CausalWanConfig(
        model_dir=root, layout=layout, preset=recipe, transformer=transformer, vae=vae,
        height=height, width=width, frames_per_block=frames_per_block,
        window_frames=recipe.window_frames if window_frames is None else window_frames,
        sink_frames=recipe.sink_frames if sink_frames is None else sink_frames,
        text_len=text_len, use_ema=recipe.use_ema if use_ema is None else use_ema,
        denoising_steps=tuple(denoising_steps or recipe.denoising_steps),
        generator_ckpt=_optional_path(generator_ckpt), lora_ckpt=_optional_path(lora_ckpt),
        lora_alpha=lora_alpha, cfg=cfg, vae_dtype=vae_dtype, session_capacity=session_capacity,
        text_encoder_device=text_encoder_device)
    _check(config)
    return config


def _optional_path(value: str | None) -> Path | None:
    return None if value is None else _arg_path(value)


def _arg_path(value: str) -> Path:
    """A path of pipeline.args, `~` expanded and made absolute against the working directory
    (docs/configs.md#paths-in-a-config), so every message names the folder it looked in."""
    return Path.cwd() / Path(value).expanduser()


def _check(c: CausalWanConfig) -> None:
    factor = c.vae.spatial_factor * c.transformer.patch_size[1]
    for name, value in (("height", c.height), ("width", c.width)):
        if not (isinstance(value, int) and value > 0 and value % factor == 0):
            raise ConfigError(f"pipeline.args.{name}: {value!r} must be a positive multiple of "
                              f"{factor} (the VAE's {c.vae.spatial_factor}x times the patch "
                              f"size {c.transformer.patch_size[1]}); e.g. 480 x 832")
    if c.transformer.patch_size[0] != 1:
        raise ConfigError(f"pipeline.args.model_dir: patch_size {c.transformer.patch_size} "
                          f"patches time; causal-wan needs a time patch of 1 (one latent "
                          f"frame per token row)")
    if c.vae.z_dim != c.transformer.in_channels:
        raise ConfigError(f"pipeline.args.model_dir: the VAE's z_dim {c.vae.z_dim} differs from "
                          f"the transformer's in_channels {c.transformer.in_channels}")
    if c.vae_dtype not in DTYPE_BYTES:
        raise ConfigError(f"pipeline.args.vae_dtype: {c.vae_dtype!r} is not allowed; use one "
                          f"of {', '.join(DTYPE_BYTES)}")
    if not (isinstance(c.text_encoder_device, str)
            and re.fullmatch(TEXT_ENCODER_DEVICES, c.text_encoder_device)):
        raise ConfigError(f"pipeline.args.text_encoder_device: {c.text_encoder_device!r} is not "
                          f"allowed; use auto, cpu, cuda or cuda:N")
    if not all(isinstance(s, int) and 0 < s <= 1000 for s in c.denoising_steps):
        raise ConfigError(f"pipeline.args.denoising_steps: {list(c.denoising_steps)!r} must be "
                          f"integers in 1..1000, e.g. [1000, 750, 500, 250]")
