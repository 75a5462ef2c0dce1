"""A pipeline that goes wrong on purpose, for tests/rollout/test_faults.py and tests/cli/test_catalogue.py.

`FaultPipeline` is a tiny but real KV pipeline (2 layers, blocks of 2 frames of 2 tokens, a
4-frame window with a 1-frame sink): every forward runs one probe and one commit. Video frame
f (block b, frame i: f = b * 2 + i) is filled with `f % 256`, so a test reads off a video
which blocks it holds. Warmup requests carry `extra={"warmup": True}`; the faults aimed at the
rollout leave them alone. Its class docstring lists the faults.

Self-contained (the public `ardiff` API only), so the installed command loads it as
`/abs/path/fault_pipelines.py:FaultPipeline` in another process too. The names it defines
appear in a message the errors page quotes: standard modules are imported where used.
"""

from __future__ import annotations

import torch

import ardiff

BRANCH = "main"
FRAMES_PER_BLOCK = 2
STAGES = ("before", "probe", "commit", "after_commit")
FAULTS = ("forward", "interrupt", "exit", "signal", "signal_warmup", "signal_load", "reset_hook",
          "close_hook", "warmup", "load", "dtype", "shape", "size", "hang", "close_hang",
          "open_block", "thread")

# 2 layers x 1 KV head x 8 dims, 2 tokens per frame, blocks of 2 frames, a 4-frame
# window with a 1-frame sink: 3 frames (3 pages) of history per session.
FAULT_SPEC = dict(num_layers=2, num_kv_heads=1, head_size=8, tokens_per_frame=2,
                  frames_per_block=FRAMES_PER_BLOCK, window_frames=4, sink_frames=1,
                  session_capacity=2, kv_branches=(ardiff.ARDiffusionKVBranchSpec("main", 0),))


def paint(frame: int) -> int:
    """The value every pixel of video frame `frame` holds."""
    return frame % 256


class InjectedFault(RuntimeError):
    """What FaultPipeline raises on purpose."""


class FaultPipeline(ardiff.ARDiffusionPipelineBase):
    """A real (tiny) KV pipeline with one fault switched on (or none: `fault=None`).

    `fault` picks what goes wrong and `at_block` at which rollout block:

        forward     generate_block raises RuntimeError at `stage`: before (no KV touched),
                    probe (inside the probe block), commit (inside the commit block, after
                    layer 0 attended), after_commit (the block's history already written)
        interrupt   generate_block raises KeyboardInterrupt inside the commit block
        exit        generate_block calls sys.exit(exit_code) inside the commit block
        signal      generate_block sends this process `signal_name` inside the commit block
                    (as a user's Ctrl-C or `kill` lands mid-block); refuses to when no Python
                    handler is installed for it, so a broken CLI cannot kill the test run
        signal_warmup  the same, at the end of the first warmup block
        signal_load    the same, inside load(device, dtype)
        reset_hook  reset_ar_diffusion_session drops its state, then raises
        close_hook  close_ar_diffusion_session drops its state, then raises
        warmup      every warmup forward raises (rollout blocks are fine)
        load        load(device, dtype) raises (weights missing)
        dtype       BlockOutput.frames is float32 from `at_block` on
        shape       BlockOutput.frames has 4 channels from `at_block` on
        size        BlockOutput.frames grow by 2 pixels a side from `at_block` on
        hang        generate_block does not return at `stage` of `at_block` (for `hang_s`, then
                    it raises), the way `hang` says: sleep (time.sleep), busy (a Python loop),
                    swallow (a loop that swallows every exception, KeyboardInterrupt too) or
                    c_call (a blocking C call no signal interrupts: a pthread mutex locked
                    twice, the second time with a timeout)
        close_hang  close_ar_diffusion_session of a rollout session never returns (`hang`)
        open_block  generate_block enters its commit block at `at_block` and never exits it
        thread      load() starts a thread (not a daemon) that never ends

    `block_sleep_s` makes every rollout block that long (time.sleep: a slow model without
    CPU load); `marker` names a file holding the number of rollout blocks made so far
    (replaced atomically), so a test in another process can signal a run once it has frames;
    a hang first creates `{marker}.hang`. `send_signals` (names) are sent to the main thread,
    50 ms apart, by a helper thread once a hang starts (as a user's `kill`, twice, would).
    """

    HANGS = ("sleep", "busy", "swallow", "c_call")

    def __init__(self, fault: str | None = None, at_block: int = 0, stage: str = "commit",
                 frame_size: int = 16, warmup_blocks: int = 2,
                 video_frames_per_latent_frame: int = 1, exit_code: int = 5,
                 signal_name: str = "SIGINT", block_sleep_s: float = 0.0,
                 marker: str | None = None, hang: str = "sleep", hang_s: float = 1e9,
                 send_signals: tuple[str, ...] = (), **spec_fields) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {', '.join(FAULTS)}")
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
        self.fault, self.at_block, self.stage = fault, at_block, stage
        import signal

        self.exit_code, self.signum = exit_code, signal.Signals[signal_name]
        self.block_sleep_s, self.marker, self.blocks_made = block_sleep_s, marker, 0
        if hang not in self.HANGS:
            raise ValueError(f"hang {hang!r} is not one of {', '.join(self.HANGS)}")
        self.hang, self.hang_s, self.send_signals = hang, hang_s, tuple(send_signals)
        self.frame_size, self.warmup_blocks = frame_size, warmup_blocks
        self.video_frames_per_latent_frame = video_frames_per_latent_frame  # planning only
        self.spec = ardiff.ARDiffusionKVCacheSpec(**{**FAULT_SPEC, **spec_fields})
        self.sessions: set[str] = set()  # model-owned state: sessions with a decoder

    # -- contract --------------------------------------------------------------------
    def ar_diffusion_kv_cache_spec(self) -> ardiff.ARDiffusionKVCacheSpec:
        return self.spec

    def load(self, device, dtype) -> None:
        if self.fault == "thread":
            import threading

            threading.Thread(target=threading.Event().wait, name="never-ends").start()
        if self.fault == "load":
            raise InjectedFault("checkpoint /models/missing.safetensors not found")
        if self.fault == "signal_load":
            self._signal()

    def reset_ar_diffusion_session(self, session_id: str) -> None:
        self.sessions.discard(session_id)
        if self.fault == "reset_hook":
            raise InjectedFault(f"reset hook of {session_id!r}")

    def close_ar_diffusion_session(self, session_id: str) -> None:
        self.sessions.discard(session_id)
        if self.fault == "close_hook":
            raise InjectedFault(f"close hook of {session_id!r}")
        if self.fault == "close_hang" and session_id.startswith("stream-"):
            self._hang()

    def ar_diffusion_warmup_requests(self, session_id: str) -> list[ardiff.RolloutRequest]:
        return [ardiff.RolloutRequest(session_id, block_index=i, prompt="warmup",
                                      extra={"warmup": True})
                for i in range(self.warmup_blocks)]

    def generate_block(self, request: ardiff.RolloutRequest,
                       state: ardiff.ARDiffusionKVState) -> ardiff.BlockOutput:
        if request.extra.get("warmup") and self.fault == "warmup":
            raise InjectedFault(f"warmup block {request.block_index}")
        faulty = not request.extra.get("warmup") and request.block_index >= self.at_block
        strike = faulty and request.block_index == self.at_block
        self._strike(strike, "before")
        self.sessions.add(request.session_id)
        with state.block(BRANCH, commit=False) as blk:
            self._attend_all(blk, strike, "probe")
        if strike and self.fault == "open_block":  # entered, never exited
            self._attend_all(state.block(BRANCH, commit=True).__enter__(), False, "commit")
        else:
            with state.block(BRANCH, commit=True) as blk:
                self._attend_all(blk, strike, "commit")
        self._strike(strike, "after_commit")
        if request.extra.get("warmup") and self.fault == "signal_warmup":
            self._signal()  # after the commit: warmup holds pages when it is interrupted
        if not request.extra.get("warmup"):
            self._made_block()
        return ardiff.BlockOutput(frames=self._frames(request.block_index, faulty))

    # -- inside ------------------------------------------------------------------------
    def _attend_all(self, blk, strike: bool, stage: str) -> None:
        s = self.spec
        x = torch.zeros(blk.num_frames * s.tokens_per_frame, s.num_kv_heads, s.head_size)
        for layer in range(s.num_layers):
            if layer == 1:  # layer 0's K/V already sit in in-flight pages
                self._strike(strike, stage)
            blk.attend(layer, x, x, x)  # [tokens, heads, head_size]

    def _strike(self, strike: bool, stage: str) -> None:
        if not strike:
            return
        if self.fault == "interrupt" and stage == "commit":
            raise KeyboardInterrupt
        if self.fault == "exit" and stage == "commit":
            import sys

            sys.exit(self.exit_code)
        if self.fault == "signal" and stage == "commit":
            self._signal()
        if self.fault == "forward" and stage == self.stage:
            raise InjectedFault(f"forward of block {self.at_block} ({stage})")
        if self.fault == "hang" and stage == self.stage:
            self._hang()

    def _hang(self) -> None:
        """Do not return for `hang_s`, the way `hang` says, then raise (a test that nothing
        stopped fails instead of hanging); first mark it and start `send_signals`."""
        import threading
        import time

        if self.marker:
            open(f"{self.marker}.hang", "w").close()
        if self.send_signals:
            threading.Thread(target=self._send_signals, args=(threading.main_thread().ident,),
                             daemon=True).start()
        deadline = time.monotonic() + self.hang_s
        if self.hang == "sleep":
            time.sleep(self.hang_s)
        while self.hang == "busy" and time.monotonic() < deadline:
            pass
        while self.hang == "swallow" and time.monotonic() < deadline:
            try:
                time.sleep(max(0.0, deadline - time.monotonic()))
            except BaseException:  # noqa: BLE001 - on purpose: a pipeline that will not stop
                pass
        if self.hang == "c_call":
            self._lock_twice(time.time() + self.hang_s)
        raise InjectedFault(f"the hang ({self.hang}) lasted {self.hang_s:g} s: nothing stopped it")

    @staticmethod
    def _lock_twice(until: float) -> None:
        """A normal pthread mutex locked twice, the second time until `until` (time.time()):
        a C call that signals do not interrupt (their handlers run, the wait goes on)."""
        import ctypes

        class Timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeros: PTHREAD_MUTEX_INITIALIZER (glibc)
        libc.pthread_mutex_lock(mutex)
        seconds = min(int(until), 2**62)
        libc.pthread_mutex_timedlock(mutex, ctypes.byref(Timespec(seconds, 0)))

    def _send_signals(self, main: int) -> None:
        import signal
        import time

        for name in self.send_signals:
            time.sleep(0.05)
            signum = signal.Signals[name]
            if not callable(signal.getsignal(signum)):  # never kill the test run itself
                raise InjectedFault(f"no Python handler for {name}; not sending it")
            signal.pthread_kill(main, signum)

    def _signal(self) -> None:
        """Deliver `signum` to this process now; its Python handler runs before this returns."""
        import signal

        if not callable(signal.getsignal(self.signum)):
            raise InjectedFault(f"no Python handler for {self.signum.name}; not sending it")
        signal.raise_signal(self.signum)

    def _made_block(self) -> None:
        import os
        import time

        time.sleep(self.block_sleep_s)
        self.blocks_made += 1
        if self.marker:
            tmp = f"{self.marker}.tmp"
            with open(tmp, "w", encoding="utf-8") as marker:
                marker.write(str(self.blocks_made))
            os.replace(tmp, self.marker)  # a reader never sees a half-written number

    def _frames(self, block_index: int, faulty: bool) -> torch.Tensor:
        """[F, H, W, 3] uint8 (or broken from `at_block` on, as `fault` says)."""
        first = block_index * FRAMES_PER_BLOCK
        values = torch.tensor([paint(first + i) for i in range(FRAMES_PER_BLOCK)],
                              dtype=torch.uint8)
        side = self.frame_size + (2 if faulty and self.fault == "size" else 0)
        channels = 4 if faulty and self.fault == "shape" else 3
        frames = values[:, None, None, None].expand(FRAMES_PER_BLOCK, side, side, channels)
        if faulty and self.fault == "dtype":
            return frames.float()
        return frames.contiguous()
