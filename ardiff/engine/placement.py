"""Weights beside the KV plan: how big each part is, where it lives, and whether it all fits.

    parts = get_weight_bytes(pipeline, "bfloat16")     # the pipeline's `weight_bytes` hook
    devices = place_weights(pipeline, parts, "cuda", fits)   # its `place_weights` hook
    fit = MemoryFit(memory_bytes, weights_on_device, plan.total_bytes)

    device memory  |== weights on the device ==|== KV plan ==|== margin ==|.. spare ..|

`fits` (`fits_in`) is ardiff's arithmetic (weights on the device + the KV plan they leave
room for + an estimated margin, `activation_margin` <= the device's memory); which parts move off the
device when it does not hold is the pipeline's choice. Both hooks are optional: without
`weight_bytes` there are no weights to show, without `place_weights` every part lives on
the run device.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ardiff.errors import ArdiffError, CapacityError, ConfigError, PipelineLoadError
from ardiff.sizes import MemoryBudget
from ardiff.text import short_repr, shorten

# Room kept free for what a forward allocates beside the weights and the KV cache: an
# estimate, never a measurement. On CUDA, the context and library workspaces
# (`CUDA_CONTEXT_BYTES`, ~1 GiB); then one block's activations: the pipeline's
# `activation_bytes(dtype)` where it declares them (causal-Wan: a video VAE's decode at full
# resolution), else a quarter of its weights on the device (`activation_margin`).
CUDA_CONTEXT_BYTES = 2**30
ACTIVATIONS_PER_WEIGHT = 0.25  # activations estimated as this share of the weights on the device
MIN_ACTIVATION_BYTES = 64 * 2**20  # ... and never below this (torch's working buffers, a frame)
ACTIVATION_MARGIN_BYTES = 3 * 2**30  # the margin of a model that says nothing else (tests)
AUTO = "auto"  # a part whose place needs the device's memory, when it is not known
PARTS_EXAMPLE = "{'transformer': 2844248192}"


@dataclass(frozen=True)
class WeightPlan:
    """Bytes of each part of the pipeline's weights and the device each part lives on."""

    parts: Mapping[str, int]
    devices: Mapping[str, str]   # a device name, or AUTO: undecided without the memory
    run_device: str

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def device_bytes(self) -> int:
        """Bytes on the run device (an AUTO part counts there: the place it prefers)."""
        return sum(n for name, n in self.parts.items()
                   if self.devices[name] == AUTO or same_device(self.devices[name],
                                                                self.run_device))

    def to_dict(self) -> dict[str, Any]:
        return {"parts": {name: {"bytes": n, "device": self.devices[name]}
                          for name, n in self.parts.items()},
                "device_bytes": self.device_bytes, "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class MemoryFit:
    """Whether weights on the device, the KV plan and the margin fit `memory_bytes`."""

    memory_bytes: int
    weight_bytes: int    # on the run device
    kv_bytes: int        # the plan's bytes allocated
    margin_bytes: int = ACTIVATION_MARGIN_BYTES

    @property
    def needed_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.margin_bytes

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "weight_bytes": self.weight_bytes,
                "kv_bytes": self.kv_bytes, "margin_bytes": self.margin_bytes,
                "needed_bytes": self.needed_bytes, "fits": self.fits}


def same_device(a: str, b: str) -> bool:
    """`cuda` and `cuda:0` name one device; `cpu` is only itself."""
    def indexed(name: str) -> str:
        return name if ":" in name or name == "cpu" else f"{name}:0"
    return indexed(a) == indexed(b)


def parse_device_memory(value: str) -> int:
    """`--device-memory`: a size in bytes (24GiB, 80GB, 25769803776); a `ConfigError`
    naming the flag otherwise (a fraction means nothing here)."""
    try:
        memory = MemoryBudget.parse(value, "--device-memory")
    except ConfigError:
        memory = MemoryBudget(fraction=1.0)
    if memory.num_bytes is None:
        raise ConfigError(f"--device-memory: {short_repr(value)} is not a size in bytes; give "
                          f"the device's memory like 24GiB, 80GB or 25769803776")
    return memory.num_bytes


def fits_in(memory_bytes: int, kv_bytes_for: Callable[[int], int],
            margin_for: Callable[[int], int] = lambda weight_bytes: ACTIVATION_MARGIN_BYTES,
            ) -> Callable[[int], bool]:
    """`fits(weight_bytes)`: do that many bytes of weights on the device, the KV plan made
    with the memory they leave (`kv_bytes_for(free_bytes)`; a `CapacityError` there: not one
    session) and the margin (`margin_for(weight_bytes)`) fit `memory_bytes`?"""
    def fits(weight_bytes: int) -> bool:
        try:
            kv_bytes = kv_bytes_for(max(memory_bytes - weight_bytes, 0))
        except CapacityError:
            return False
        return MemoryFit(memory_bytes, weight_bytes, kv_bytes, margin_for(weight_bytes)).fits
    return fits


def activation_margin(pipeline: object, dtype: str, device: str) -> Callable[[int], int]:
    """`margin(weight_bytes_on_device)`: the estimate of what a forward needs beside weights
    and KV on `device` (see `CUDA_CONTEXT_BYTES`): the pipeline's `activation_bytes(dtype)`,
    else `ACTIVATIONS_PER_WEIGHT` of its weights there (at least `MIN_ACTIVATION_BYTES`);
    plus the CUDA context on CUDA."""
    context = CUDA_CONTEXT_BYTES if device.startswith("cuda") else 0
    hook = getattr(pipeline, "activation_bytes", None)
    if callable(hook):
        declared = _call(hook, f"activation_bytes({dtype!r})", dtype)
        if type(declared) is not int or declared < 0:
            raise PipelineLoadError(f"pipeline: activation_bytes({dtype!r}) returned "
                                    f"{short_repr(declared)}; it must return bytes, an int >= 0")
        return lambda weight_bytes: context + declared
    return lambda weight_bytes: context + max(MIN_ACTIVATION_BYTES,
                                              int(weight_bytes * ACTIVATIONS_PER_WEIGHT))


def get_weight_bytes(pipeline: object, dtype: str) -> dict[str, int] | None:
    """The pipeline's `weight_bytes(dtype)`, checked; None if it declares none."""
    hook = getattr(pipeline, "weight_bytes", None)
    if not callable(hook):
        return None
    parts = _call(hook, f"weight_bytes({dtype!r})", dtype)
    if not (isinstance(parts, Mapping) and all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in parts.items())):
        raise PipelineLoadError(f"pipeline: weight_bytes({dtype!r}) returned "
                            f"{shorten(short_repr(parts), 80)}; it must return a mapping of part "
                            f"names to bytes, like {PARTS_EXAMPLE}")
    return dict(parts)


def place_weights(pipeline: object, parts: Mapping[str, int], device: str,
                  fits: Callable[[int], bool] | None) -> WeightPlan:
    """Where each part lives: the pipeline's `place_weights(device, fits)` decides, given
    `fits(names)` (do these parts on `device` leave room for the KV plan and the margin?).
    `fits` None (the memory is unknown): a part placed differently when everything fits and
    when nothing does is AUTO. Without the hook every part lives on `device`."""
    hook = getattr(pipeline, "place_weights", None)
    if not callable(hook):
        return WeightPlan(dict(parts), {name: device for name in parts}, device)
    if fits is not None:
        return WeightPlan(dict(parts), _placement(hook, parts, device, _by_names(parts, fits)),
                          device)
    roomy = _placement(hook, parts, device, lambda names: True)
    tight = _placement(hook, parts, device, lambda names: False)
    devices = {name: roomy[name] if roomy[name] == tight[name] else AUTO for name in parts}
    return WeightPlan(dict(parts), devices, device)


def _by_names(parts: Mapping[str, int], fits: Callable[[int], bool]
              ) -> Callable[[Collection[str]], bool]:
    def fits_names(names: Collection[str]) -> bool:
        unknown = [name for name in names if name not in parts]
        if unknown:
            raise PipelineLoadError(f"pipeline: place_weights asked whether {unknown[0]!r} fits, a "
                                f"part its weight_bytes does not name ({', '.join(parts)})")
        return fits(sum(parts[name] for name in names))
    return fits_names


def _placement(hook: Callable[..., Any], parts: Mapping[str, int], device: str,
               fits: Callable[[Collection[str]], bool]) -> dict[str, str]:
    devices = _call(hook, f"place_weights({device!r}, fits)", device, fits)
    if not (isinstance(devices, Mapping) and set(devices) == set(parts)
            and all(isinstance(v, str) and v for v in devices.values())):
        raise PipelineLoadError(f"pipeline: place_weights({device!r}, fits) returned "
                            f"{shorten(short_repr(devices), 80)}; it must map each part of "
                            f"weight_bytes ({', '.join(parts)}) to a device name, like "
                            f"{{'text_encoder': 'cpu'}}")
    return dict(devices)


def _call(hook: Callable[..., Any], what: str, *args: Any) -> Any:
    try:
        return hook(*args)
    except ArdiffError:
        raise
    except Exception as exc:
        raise PipelineLoadError(f"pipeline: {what} raised {type(exc).__name__}: "
                            f"{shorten(str(exc))}") from exc

