"""One live session's requests, one block at a time: the rollout's blocks, steered as they go.

    walker = BlockWalker("serve-3", plan, frames=None, max_model_len=..., idle_action="none")
    walker.steer(action=("left",))                  # the next block's, then the idle action
    walker.switch_prompt("a cat", "recache")        # applies from the next block boundary
    request = walker.next_request()                 # None: the session has all its frames

Without steering, the requests are `ardiff.rollout.streams.build_request`'s for the same
plan (prompt schedule, `on_switch`, actions repeating per block), so a session makes the
frames `ardiff rollout` makes. An action pipeline's block with no action from the client or
the session's list gets the idle action (`play.idle`, as `ardiff play` does); the request
carries what was used, so the log replays with `rollout.actions`. An open-ended session
(frames None) ends where its positions would pass `max_model_len`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ardiff.config.run import PromptSwitch
from ardiff.contract.forward import RolloutRequest
from ardiff.rollout.streams import RolloutPlan

Actions = tuple[str, ...]


@dataclass(frozen=True)
class LiveSwitch:
    """A prompt switch a client asked for: applies at the next block boundary."""

    prompt: str
    on_switch: str  # keep | clear-cross | reset | recache


class BlockWalker:
    """Builds each block's request; `start_frame` is the video frame the next block starts at."""

    def __init__(self, session_id: str, plan: RolloutPlan, frames: int | None,
                 frames_cap: int, frames_per_block: int, max_model_len: int,
                 idle_action: str | None) -> None:
        schedule = plan.streams[0].schedule
        self.session_id, self.plan = session_id, plan
        self.frames = frames if frames is not None else frames_cap
        self.open_ended = frames is None
        self.frames_per_block, self.max_model_len = frames_per_block, max_model_len
        self.idle_action = idle_action
        self.current: PromptSwitch = schedule[0]
        self.pending: list[PromptSwitch] = list(schedule[1:])
        self.start_frame = 0
        self.block_index = 0
        self.session_block = 0
        self.live_switch: LiveSwitch | None = None
        self.live_action: Actions | None = None

    def steer(self, action: Actions) -> None:
        """The next block's action (the last one given before it wins, as a `play` tick)."""
        self.live_action = action

    def switch_prompt(self, prompt: str, on_switch: str) -> None:
        """From the next block on, `prompt`; the rest of the session's schedule is dropped."""
        self.live_switch = LiveSwitch(prompt, on_switch)

    @property
    def is_done(self) -> bool:
        if self.start_frame >= self.frames:
            return True
        resets = self.live_switch is not None and self.live_switch.on_switch == "reset"
        next_block = 0 if resets else self.session_block
        return self.open_ended and (next_block + 1) * self.frames_per_block > self.max_model_len

    def next_request(self) -> RolloutRequest | None:
        """The next block's request (and the walker moved past it); None once done."""
        if self.is_done:
            return None
        switching: str | None = None
        while self.pending and self.pending[0].position <= self.start_frame:
            self.current = self.pending.pop(0)
            switching = self.current.on_switch
        if self.live_switch is not None:
            live, self.live_switch = self.live_switch, None
            self.current = PromptSwitch(self.start_frame, live.prompt,
                                        live.on_switch)  # type: ignore[arg-type]
            switching, self.pending = live.on_switch, []
        if switching == "reset":
            self.session_block = 0
        plan = self.plan
        request = RolloutRequest(
            session_id=self.session_id, block_index=self.block_index,
            prompt=self.current.prompt, negative_prompt=plan.negative_prompt, seed=plan.seed,
            num_steps=plan.num_steps, guidance_scale=plan.guidance_scale,
            actions=self._take_action(), reset=switching == "reset",
            clear_cross_kv=switching in ("clear-cross", "recache"),
            extra={"recache": True} if switching == "recache" else {})
        first = self.session_block == 0
        self.start_frame += plan.first_block_frames if first else plan.video_frames_per_block
        self.block_index += 1
        self.session_block += 1
        return request

    def _take_action(self) -> Actions | None:
        if self.live_action is not None:
            action, self.live_action = self.live_action, None
            return action
        if self.plan.actions:
            return self.plan.actions[self.block_index % len(self.plan.actions)]
        return None if self.idle_action is None else (self.idle_action,)
