"""Named recipes of the causal-Wan family: sampler steps, shift and window.

| preset       | steps (warped?)                | shift | window / sink (frames) | weights         |
|--------------|--------------------------------|-------|------------------------|-----------------|
| self-forcing | 1000 750 500 250 (warped)      | 5     | 21 / 0                 | generator_ema   |
| causvid      | 1000 757 522                   | 8     | 21 / 0                 | generator       |
| longlive     | 1000 750 500 250 (warped)      | 5     | 9 / 3                  | generator + LoRA|

    get_preset("causvid").adjusted(warp=True)   # CausVid's warped 4-step config, with
                                                # denoising_steps 1000 750 500 250

Their `local_attn_size L` counts the sink (-1: Self-Forcing's 21 frames) and `sink_size S`
is the sink: in ardiff's words `window_frames = L - S`, `sink_frames = S` (LongLive 12 / 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ardiff.errors import ConfigError
from ardiff.pipelines.causal_wan.schedule import FlowTable

SELF_FORCING_CACHE_FRAMES = 21  # local_attn_size -1: a 32760-token cache = 21 frames of 1560


@dataclass(frozen=True)
class Preset:
    """One checkpoint family's sampler and window defaults."""

    name: str
    denoising_steps: tuple[int, ...]
    shift: float
    warp: bool
    window_frames: int
    sink_frames: int
    use_ema: bool

    @property
    def table(self) -> FlowTable:
        return FlowTable(self.shift)

    def adjusted(self, shift: float | None = None, warp: bool | None = None) -> Preset:
        """This preset with `shift` and / or `warp` replaced (None: the preset's); raises
        `ConfigError` naming `pipeline.args.shift` / `warp` for a bad value."""
        if shift is not None and not (isinstance(shift, (int, float))
                                      and not isinstance(shift, bool)
                                      and math.isfinite(shift) and shift > 0):
            raise ConfigError(f"pipeline.args.shift: {shift!r} must be a finite number > 0, "
                              f"e.g. 5 (Self-Forcing, LongLive) or 8 (CausVid)")
        if warp is not None and not isinstance(warp, bool):
            raise ConfigError(f"pipeline.args.warp: {warp!r} must be true or false")
        return replace(self, shift=self.shift if shift is None else float(shift),
                       warp=self.warp if warp is None else warp)

    def timesteps(self, steps: tuple[int, ...] | None = None) -> list[float]:
        """The model timesteps of the denoising steps (the preset's, or `steps`)."""
        steps = self.denoising_steps if steps is None else steps
        return [self.table.warp(s) if self.warp else float(s) for s in steps]


PRESETS = {p.name: p for p in (
    Preset("self-forcing", (1000, 750, 500, 250), 5.0, True,
           window_frames=SELF_FORCING_CACHE_FRAMES, sink_frames=0, use_ema=True),
    Preset("causvid", (1000, 757, 522), 8.0, False,
           window_frames=SELF_FORCING_CACHE_FRAMES, sink_frames=0, use_ema=False),
    Preset("longlive", (1000, 750, 500, 250), 5.0, True,
           window_frames=12 - 3, sink_frames=3, use_ema=False),   # local_attn_size 12, sink 3
)}


def get_preset(name: str) -> Preset:
    """The preset called `name`; raises `ConfigError` naming the known ones."""
    if name not in PRESETS:
        raise ConfigError(f"pipeline.args.preset: {name!r} is not a causal-Wan preset; use one "
                          f"of {', '.join(PRESETS)}")
    return PRESETS[name]
