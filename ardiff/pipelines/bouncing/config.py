"""The bouncing world model's config: architecture (must match the weights), window and sampling.

The KV spec, the model's shapes and the weights check all derive from one `BouncingConfig`;
its fields are the `pipeline.args` of a run config.
"""

from __future__ import annotations

from dataclasses import dataclass

import ardiff
from ardiff.pipelines.bouncing import sim

# The fields a weights file records and a config must match to load it.
ARCH_FIELDS = ("size", "patch", "dim", "num_layers", "num_heads", "mlp_ratio",
               "registers_per_action")
RGB_CHANNELS = 3   # the model's latent space is the pixels


@dataclass(frozen=True)
class BouncingConfig:
    """Architecture (must match the weights), window and sampling; the spec derives from it.

    Raises `ardiff.ConfigError` naming the field when a value breaks a rule below.
    """

    size: int = sim.SIZE
    patch: int = 8
    dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    registers_per_action: int = 2
    window_frames: int = 5      # a frame sees the 4 frames before it: enough to read velocity
    sink_frames: int = 0
    context_frames: int = 4     # simulator start frames committed before the model takes over
    num_steps: int = 4
    # History committed noised to this level (x = (1 - level) frame + level noise), the
    # level given to a model that takes it (`BouncingDiT.context_level`): weights trained
    # on noised history run with a small fixed level. 0: clean history, as trained before.
    context_noise: float = 0.0
    upscale: int = 8            # nearest-neighbour: 32 px -> 256 px video
    session_capacity: int = 8
    max_frames: int = 1_000_000
    weights: str | None = None  # a .safetensors path; None: the weights shipped with ardiff
    cpu_threads: int | None = 1  # torch threads on CPU: one is fastest for 16-token frames

    def __post_init__(self) -> None:
        rules = [(self.size % self.patch == 0, "size", "a multiple of patch"),
                 ((self.dim // max(self.num_heads, 1)) % 8 == 0, "dim",
                  "such that dim / num_heads is a multiple of 8 (3-axis RoPE)"),
                 (self.context_frames >= 1, "context_frames", ">= 1"),
                 (self.upscale >= 1, "upscale", ">= 1"),
                 (0 <= self.context_noise < 1, "context_noise", "in [0, 1)")]
        for ok, name, rule in rules:
            if not ok:
                raise ardiff.ConfigError(f"pipeline.args.{name}: {getattr(self, name)!r} "
                                         f"must be {rule}")

    @property
    def grid(self) -> int:
        return self.size // self.patch

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def head_size(self) -> int:
        return self.dim // self.num_heads

    def architecture(self) -> dict[str, int]:
        """The ARCH_FIELDS of this config, as a weights file records them."""
        return {name: getattr(self, name) for name in ARCH_FIELDS}
