"""A model built from a state dict that is not in its library's folder layout (Wan's files).

    state = read_state(path)                        .safetensors or .pth, memory-mapped
    model = build_model(lambda: Cls(**config), state, dtype, keeps_fp32, path)

`build_model` makes the module without allocating weights (accelerate's empty init; the
buffers, like the RoPE tables, are made as usual), checks that every key and shape of
`state` matches it (a one-line error naming the file otherwise), and assigns the tensors
cast as `from_pretrained` casts them: each to `dtype`, except those `keeps_fp32(name)`
says the library keeps in float32. test_layouts.py checks that
the dtypes equal `from_pretrained`'s, for bfloat16 and float16.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ardiff.errors import PipelineLoadError

SHOWN_KEYS = 3  # names listed in an error before "..."


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a `.safetensors` or a `.pth` state dict (no pickled code), or an error."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PipelineLoadError(f"pipeline.args.model_dir: cannot read {str(path)!r} "
                                f"({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict):
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} holds a "
                                f"{type(state).__name__}, not a state dict")
    return state


def keeps_fp32_by_name(modules: list[str] | set[str] | None) -> Callable[[str], bool]:
    """diffusers' rule: a parameter stays float32 if a module of its dotted name is listed."""
    listed = set(modules or ())
    return lambda name: any(part in listed for part in name.split("."))


def _names(keys: list[str]) -> str:
    shown = ", ".join(sorted(keys)[:SHOWN_KEYS])
    return shown + (f" ... ({len(keys)} in all)" if len(keys) > SHOWN_KEYS else "")


def check_state(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                path: Path) -> None:
    """Every key of the model in `state`, nothing else, each of the model's shape."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = ([f"missing {_names(missing)}"] if missing else []) + (
            [f"unexpected {_names(unexpected)}"] if unexpected else [])
        raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} does not fit the "
                                f"model its config describes: {'; '.join(parts)}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise PipelineLoadError(f"pipeline.args.model_dir: {str(path)!r} has {key} of "
                                    f"shape {tuple(value.shape)}; its config makes "
                                    f"{tuple(expected[key].shape)}")


def build_model(make: Callable[[], torch.nn.Module], state: dict[str, torch.Tensor],
                dtype: torch.dtype, keeps_fp32: Callable[[str], bool],
                path: Path) -> torch.nn.Module:
    """`make()` with `state`'s weights, cast like `from_pretrained(torch_dtype=dtype)`."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = make()
    check_state(model.state_dict(), state, path)
    cast = {k: v.to(torch.float32 if keeps_fp32(k) else dtype) if v.is_floating_point() else v
            for k, v in state.items()}
    model.load_state_dict(cast, strict=True, assign=True)
    return model
