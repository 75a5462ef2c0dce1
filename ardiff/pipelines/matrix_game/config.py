"""The matrix-game pipeline's arguments, and the shapes read from the released files.

    model_dir/                     the folder `hf download Skywork/Matrix-Game-2.0` makes
      <checkpoint>                 e.g. base_distilled_model/base_distill.safetensors
      <checkpoint dir>/config.json the checkpoint's CausalWanModel config (dims, action_config)
      Wan2.1_VAE.pth               the Wan2.1 VAE (encodes the image, decodes the video)
      models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth   CLIP; its `visual.*` only

Construction reads `config.json` and the VAE's two width tensors (memory-mapped), nothing
else. Each mode is one checkpoint's recipe (the released `configs/inference_yaml/`): steps
warped at shift 5, 3 latent frames a block, no sink, the window its `local_attn_size`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ardiff.dtypes import DTYPE_BYTES
from ardiff.errors import ConfigError, PipelineLoadError
from ardiff.pipelines.causal_wan.config import VaeShape
from ardiff.pipelines.causal_wan.layouts import WAN
from ardiff.pipelines.causal_wan.presets import Preset
from ardiff.pipelines.matrix_game.actions import SPACES, ActionSpace

CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
IMAGE_TOKENS = 257  # CLIP ViT-H/14 at 224: 16 x 16 patches + the class token
FRAMES_PER_BLOCK = 3  # num_frame_per_block of every released inference config
SHIFT = 5.0  # model_kwargs.timestep_shift
STEPS = {"universal": (1000, 666, 333), "gta_drive": (1000, 666, 333),
         "templerun": (1000, 750, 500, 250)}  # denoising_step_list (warp_denoising_step: true)
MASK_CHANNELS = 4  # the first-frame mask's channels in the input (in_dim 36 = 16 + 4 + 16)


@dataclass(frozen=True)
class ModelShape:
    """What the spec needs of the checkpoint's config.json."""

    num_layers: int
    num_heads: int
    dim: int
    in_dim: int
    out_dim: int
    local_attn_size: int
    action: dict[str, Any]

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def read(cls, path: Path) -> ModelShape:
        if not path.is_file():
            raise PipelineLoadError(f"pipeline.args.model_config: no {str(path)!r}; give the "
                                    f"checkpoint's config.json (Matrix-Game-2's "
                                    f"configs/distilled_model/<mode>/config.json)")
        try:
            config = json.loads(path.read_text())
            return cls(num_layers=config["num_layers"], num_heads=config["num_heads"],
                       dim=config["dim"], in_dim=config["in_dim"], out_dim=config["out_dim"],
                       local_attn_size=config["local_attn_size"],
                       action=config["action_config"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PipelineLoadError(f"pipeline.args.checkpoint: {str(path)!r} is not a "
                                    f"Matrix-Game CausalWanModel config ({type(exc).__name__}: "
                                    f"{exc})") from None


@dataclass(frozen=True)
class MatrixGameConfig:
    """The pipeline arguments, validated, with the model shapes they point at."""

    model_dir: Path
    checkpoint: Path
    model_config: Path
    mode: str
    model: ModelShape
    vae: VaeShape
    height: int
    width: int
    vae_dtype: str
    session_capacity: int

    @property
    def space(self) -> ActionSpace:
        return SPACES[self.mode]

    @property
    def preset(self) -> Preset:
        """The mode's sampler, as a causal-Wan preset (its window: the checkpoint's)."""
        return Preset(f"matrix-game-{self.mode}", STEPS[self.mode], SHIFT, True,
                      window_frames=self.window_frames, sink_frames=0, use_ema=False)

    @property
    def window_frames(self) -> int:
        return self.model.local_attn_size

    @property
    def latent_height(self) -> int:
        return self.height // self.vae.spatial_factor

    @property
    def latent_width(self) -> int:
        return self.width // self.vae.spatial_factor

    @property
    def tokens_per_frame(self) -> int:
        return (self.latent_height // 2) * (self.latent_width // 2)

    def timesteps(self) -> list[float]:
        return self.preset.timesteps()


def build_config(model_dir: str, checkpoint: str, mode: str, model_config: str | None = None,
                 height: int = 352, width: int = 640, vae_dtype: str = "bfloat16",
                 session_capacity: int = 4) -> MatrixGameConfig:
    """Validate the arguments and read the shapes; raises one-line typed errors.

        model_dir         the Skywork/Matrix-Game-2.0 download (relative: to the working dir)
        checkpoint        the transformer's safetensors, relative to model_dir
        mode              universal | gta_drive | templerun (the checkpoint's action space)
        model_config      the checkpoint's config.json (the released repository's
                          configs/distilled_model/<mode>/config.json); default: beside it
        height, width     352 x 640 for the released checkpoints (880 tokens a frame)
        vae_dtype         the VAE's dtype (its decode cache is sized in it)
        session_capacity  the spec's upper bound on resident sessions
    """
    if mode not in SPACES:
        raise ConfigError(f"pipeline.args.mode: {mode!r} is not a Matrix-Game 2.0 mode; use "
                          f"one of {', '.join(SPACES)}")
    root = Path.cwd() / Path(model_dir).expanduser()
    path = root / checkpoint
    config_path = path.parent / "config.json" if model_config is None \
        else Path.cwd() / Path(model_config).expanduser()
    model = ModelShape.read(config_path)
    config = MatrixGameConfig(model_dir=root, checkpoint=path, model_config=config_path,
                              mode=mode, model=model,
                              vae=VaeShape.read(root, WAN), height=height, width=width,
                              vae_dtype=vae_dtype, session_capacity=session_capacity)
    _check(config)
    return config


def _check(c: MatrixGameConfig) -> None:
    factor = c.vae.spatial_factor * 2
    for name, value in (("height", c.height), ("width", c.width)):
        if not (isinstance(value, int) and value > 0 and value % factor == 0):
            raise ConfigError(f"pipeline.args.{name}: {value!r} must be a positive multiple of "
                              f"{factor}; the released checkpoints run at 352 x 640")
    if c.vae_dtype not in DTYPE_BYTES:
        raise ConfigError(f"pipeline.args.vae_dtype: {c.vae_dtype!r} is not allowed; use one "
                          f"of {', '.join(DTYPE_BYTES)}")
    keyboard = c.model.action.get("keyboard_dim_in")
    if keyboard != len(c.space.keyboard) or bool(c.model.action.get("enable_mouse")) \
            != c.space.has_mouse:
        raise ConfigError(f"pipeline.args.mode: {c.mode!r} takes {len(c.space.keyboard)} "
                          f"keyboard inputs{' and a mouse' if c.space.has_mouse else ''}, but "
                          f"its config.json has keyboard_dim_in "
                          f"{keyboard} and enable_mouse {c.model.action.get('enable_mouse')}; "
                          f"pick the mode of that checkpoint")
    if c.model.local_attn_size < FRAMES_PER_BLOCK:
        raise ConfigError(f"pipeline.args.checkpoint: local_attn_size "
                          f"{c.model.local_attn_size} is below a block of {FRAMES_PER_BLOCK} "
                          f"frames; matrix-game needs a window of at least one block")
