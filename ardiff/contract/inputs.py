"""What a pipeline takes besides its KV: a prompt, a first image, actions.

    class BouncingWorld(ARDiffusionPipelineBase):
        ardiff_inputs = PipelineInputs(prompt="ignored", actions="accepted")

ardiff's own declaration, beside the upstream contract (which has none). Each input is
`ignored` (the model never reads it: giving one is a mistake worth a warning), `accepted`
(used when given) or `required` (a request without it is refused before any work). A
pipeline that declares nothing is taken at its word for everything: ardiff checks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, get_args

InputUse = Literal["ignored", "accepted", "required"]
INPUT_USES: tuple[str, ...] = get_args(InputUse)


@dataclass(frozen=True)
class PipelineInputs:
    """How a pipeline uses each input a request can carry (`RolloutRequest.prompt`,
    `.actions`; an image where the pipeline takes one)."""

    prompt: InputUse = "accepted"
    image: InputUse = "ignored"
    actions: InputUse = "ignored"

    def __post_init__(self) -> None:
        for item in fields(self):
            use = getattr(self, item.name)
            if use not in INPUT_USES:
                raise ValueError(f"PipelineInputs.{item.name}={use!r}; expected one of "
                                 f"{', '.join(INPUT_USES)}")

    def takes(self, name: str) -> bool:
        """Whether the model reads input `name` at all (`accepted` or `required`)."""
        return bool(getattr(self, name) != "ignored")

    def needs(self, name: str) -> bool:
        """Whether a request must carry input `name`."""
        return bool(getattr(self, name) == "required")


def get_pipeline_inputs(pipeline: object) -> PipelineInputs | None:
    """The pipeline's declaration (its `ardiff_inputs` attribute), or None when it declares
    none. Raises TypeError when the attribute is something else."""
    declared = getattr(pipeline, "ardiff_inputs", None)
    if declared is None or isinstance(declared, PipelineInputs):
        return declared
    raise TypeError(f"{type(pipeline).__name__}.ardiff_inputs is a {type(declared).__name__}; "
                    f"expected ardiff.PipelineInputs")
