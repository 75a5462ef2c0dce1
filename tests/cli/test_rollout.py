"""`ardiff rollout`, end to end: the command run from tmp_path, its video opened with
PyAV / Pillow / numpy, its `--json` checked against STATS_SCHEMA.

The test pipelines log what they were asked for (tests/support/rollout_pipelines.py)
or fail on purpose (tests/support/probe_pipeline.py); both make blocks of 2 frames.
Rollouts are a few blocks long and run in-process through Typer's runner (`ardiff`).
Three tests (marked slow) run the installed command in a subprocess (`installed`): the
default config, Ctrl-C (a real SIGINT) and the CI smoke script; a heavy one, `--json -`
of a pipeline that prints on every descriptor.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import jsonschema
import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from typer.testing import CliRunner, Result

from ardiff.config.run import load_config
from ardiff.engine.build import build_runner
from ardiff.rollout.report import STATS_SCHEMA
from ardiff.rollout.streams import iter_rollout, plan_rollout
from ardiff_cli.main import app

REPO = Path(__file__).resolve().parents[2]
TESTS_DIR = REPO / "tests"
ROLLOUT_PIPELINES = TESTS_DIR / "support" / "rollout_pipelines.py"
PROBE_PIPELINES = TESTS_DIR / "support" / "probe_pipeline.py"
TINY_DIT_CONFIG = REPO / "configs" / "tiny-dit.yaml"
BIN_DIR = Path(sys.executable).parent
ARDIFF = shutil.which("ardiff", path=str(BIN_DIR)) or shutil.which("ardiff")
FRAMES_PER_BLOCK = 2   # both test pipelines
FRAME_SIZE = 16        # RecordingPipeline's default frame side
GREY_STEP = 20         # RecordingPipeline paints frame f grey f * 20
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "200",
       "NO_COLOR": "1"}
ENV.pop("FORCE_COLOR", None)


# -- helpers -----------------------------------------------------------------------------------
def ardiff(cwd: Path, *args: object) -> Result:
    """`ardiff ARGS` run from `cwd`, in this process; an exception that escapes fails the test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def installed(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    """`ardiff ARGS` through the installed command, in a subprocess run from `cwd`."""
    assert ARDIFF, "the ardiff command is not installed next to this Python"
    return subprocess.run([ARDIFF, *map(str, args)], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=120)


def write_config(tmp_path: Path, cls: str = "RecordingPipeline", file: Path = ROLLOUT_PIPELINES,
                 args: dict | None = None, rollout: dict | None = None,
                 output: dict | None = None) -> Path:
    data = {"pipeline": {"entry": f"{file}:{cls}", "args": args or {}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": 6, "prompt": "p", **(rollout or {})},
            "output": {"path": "out.mp4", "fps": 8, **(output or {})}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def load_stats(path: Path) -> dict:
    """The --json file, validated against the schema."""
    data = json.loads(path.read_text())
    jsonschema.validate(data, STATS_SCHEMA)
    return data


def decode(path: Path) -> tuple[np.ndarray, Fraction | None]:
    """Every frame of any format as uint8 [N, H, W, 3], and the stream rate (PyAV formats)."""
    if path.is_dir():
        return np.stack([np.asarray(Image.open(p).convert("RGB"))
                         for p in sorted(path.glob("frame_*.png"))]), None
    if path.suffix == ".npy":
        return np.load(path), None
    if path.suffix in (".gif", ".webp"):
        with Image.open(path) as image:
            frames = []
            for index in range(image.n_frames):
                image.seek(index)
                frames.append(np.asarray(image.convert("RGB")))
        return np.stack(frames), None
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        return np.stack(frames), stream.average_rate


def greys(frames: np.ndarray) -> list[float]:
    return [float(frame.mean()) for frame in frames]


def library_frames(config_path: Path | None, *overrides: str) -> np.ndarray:
    """The frames the library produces for a config, straight from iter_rollout (no writer)."""
    config = load_config(config_path, list(overrides))
    runner = build_runner(config)
    try:
        spec = runner.cache.spec
        per_latent = getattr(runner.pipeline, "video_frames_per_latent_frame", 1)
        plan = plan_rollout(config, spec, spec.frames_per_block * per_latent)
        return torch.cat([event.frames for event in iter_rollout(runner, plan)]).numpy()
    finally:
        runner.close()


def assert_one_error_line(result: Result, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


# -- the default config and exact frames -------------------------------------------------------
@pytest.mark.slow
def test_the_default_config_writes_a_playable_mp4(tmp_path):
    height, width = library_frames(None, "rollout.frames=1", "warmup.enabled=false").shape[1:3]
    scale = load_config(None).output.scale   # the writer upscales the model's frames
    height, width = height * scale, width * scale

    result = installed(tmp_path, "rollout", "--frames", 12, "--fps", 8)

    assert result.returncode == 0, result.stderr
    frames, rate = decode(tmp_path / "ardiff_out.mp4")
    assert frames.shape == (12, height + height % 2, width + width % 2, 3)  # H.264 pads odd sizes
    assert rate == 8
    assert "Rollout: ok" in result.stdout and "12 / 12" in result.stdout


def test_npy_and_png_folder_hold_exactly_the_library_frames(tmp_path):
    # The library side skips warmup: warmup must not change what the rollout makes.
    expected = library_frames(TINY_DIT_CONFIG, "rollout.frames=5", "rollout.seed=3")

    npy = ardiff(tmp_path, "rollout", TINY_DIT_CONFIG, "--frames", 5, "--seed", 3, "-o", "out.npy")
    png = ardiff(tmp_path, "rollout", TINY_DIT_CONFIG, "--frames", 5, "--seed", 3, "-o", "pngs/")

    assert npy.exit_code == 0 == png.exit_code, npy.stderr + png.stderr
    assert expected.shape[0] == 5 and expected.dtype == np.uint8
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
    assert sorted(p.name for p in (tmp_path / "pngs").iterdir()) == [
        f"frame_{i:06d}.png" for i in range(5)]
    np.testing.assert_array_equal(decode(tmp_path / "pngs")[0], expected)


# Exact: lossless formats. Lossy ones keep the grey level of each frame within a few steps.
FORMATS = {".mp4": 3, ".mkv": 0, ".webm": 3, ".gif": 0, ".webp": 3, ".npy": 0, "pngs/": 0}


@pytest.mark.parametrize("suffix", list(FORMATS))
def test_every_format_round_trips_with_exactly_the_frames_asked_for(tmp_path, suffix):
    name = suffix if suffix.endswith("/") else f"out{suffix}"
    config = write_config(tmp_path)

    # 5 frames in blocks of 2: the third block is cut to one frame.
    result = ardiff(tmp_path, "rollout", config, "--frames", 5, "-o", name, "--fps", 8,
                    "--json", "stats.json")

    assert result.exit_code == 0, result.stderr
    frames, rate = decode(tmp_path / name)
    assert frames.shape == (5, FRAME_SIZE, FRAME_SIZE, 3)
    assert greys(frames) == pytest.approx([i * GREY_STEP for i in range(5)], abs=FORMATS[suffix])
    assert rate in (None, 8)
    assert not list(tmp_path.glob(".*partial*"))  # the hidden work file became the output
    stats = load_stats(tmp_path / "stats.json")
    assert stats["frames"] == {"requested": 5, "written": 5, "output_fps": 8}
    assert stats["timing"]["blocks"] == 3 and stats["outputs"][0]["frames"] == 5


# -- what reaches the pipeline -----------------------------------------------------------------
SCHEDULE = [{"frame": 0, "prompt": "a cat"},
            {"frame": 4, "prompt": "a dog", "on_switch": "keep"},         # block 2
            {"frame": 7, "prompt": "a cow", "on_switch": "clear-cross"},  # rounded up: block 4
            {"frame": 10, "prompt": "a hen", "on_switch": "reset"}]       # block 5


def test_prompt_schedule_and_inline_actions_reach_the_pipeline(tmp_path):
    log = tmp_path / "log.jsonl"
    config = write_config(tmp_path, args={"log": str(log)},
                          rollout={"prompt": SCHEDULE, "actions": ["left", ["up", "down"]]})

    result = ardiff(tmp_path, "rollout", config, "--frames", 14)

    assert result.exit_code == 0, result.stderr
    blocks = read_log(log)
    assert [b["block_index"] for b in blocks] == list(range(7))
    assert [b["prompt"] for b in blocks] == ["a cat"] * 2 + ["a dog"] * 2 + ["a cow"] + [
        "a hen"] * 2
    assert [b["clear_cross_kv"] for b in blocks] == [0, 0, 0, 0, 1, 0, 0]
    assert [b["reset"] for b in blocks] == [0, 0, 0, 0, 0, 1, 0]
    assert [b["had_cross_kv"] for b in blocks] == [0, 1, 1, 1, 0, 0, 1]  # keep kept it
    assert [b["start_frame"] for b in blocks] == [0, 2, 4, 6, 8, 0, 2]   # reset restarts at 0
    assert [b["actions"] for b in blocks] == [["left"], ["up", "down"]] * 3 + [["left"]]
    assert decode(tmp_path / "out.mp4")[0].shape[0] == 14


def test_actions_file_reaches_the_pipeline_and_wins_over_the_config(tmp_path):
    log = tmp_path / "log.jsonl"
    config = write_config(tmp_path, args={"log": str(log)}, rollout={"actions": ["left"]})
    (tmp_path / "acts.yaml").write_text("actions:\n  - right\n  - [none, up]\n  - down\n")

    result = ardiff(tmp_path, "rollout", config, "--frames", 8, "--actions", "acts.yaml")

    assert result.exit_code == 0, result.stderr
    assert [b["actions"] for b in read_log(log)] == [["right"], ["none", "up"], ["down"],
                                                    ["right"]]


@pytest.mark.parametrize("interleave", [False, True])
def test_several_prompts_give_one_output_each(tmp_path, interleave):
    log = tmp_path / "log.jsonl"
    config = write_config(tmp_path, args={"log": str(log)})
    (tmp_path / "prompts.txt").write_text("# two videos\na cat\n\na dog\n")

    result = ardiff(tmp_path, "rollout", config, "--prompts", "prompts.txt", "--frames", 4,
                    "--set", f"rollout.interleave={str(interleave).lower()}",
                    "--json", "stats.json")

    assert result.exit_code == 0, result.stderr
    order = [(b["session_id"], b["prompt"]) for b in read_log(log)]
    cat, dog = ("stream-0", "a cat"), ("stream-1", "a dog")
    assert order == ([cat, dog, cat, dog] if interleave else [cat, cat, dog, dog])
    for index in range(2):
        frames = decode(tmp_path / f"out-{index}.mp4")[0]
        assert greys(frames) == pytest.approx([0, 20, 40, 60], abs=3)  # each from frame 0
    assert not (tmp_path / "out.mp4").exists()
    stats = load_stats(tmp_path / "stats.json")
    assert [(o["path"], o["prompt"], o["frames"]) for o in stats["outputs"]] == [
        ("out-0.mp4", "a cat", 4), ("out-1.mp4", "a dog", 4)]
    assert stats["frames"]["requested"] == 8 == stats["frames"]["written"]
    assert stats["sessions"]["created"] == 2 == stats["sessions"]["closed"]


# -- failure, Ctrl-C -----------------------------------------------------------------------------
def test_a_failure_at_block_k_keeps_the_earlier_frames(tmp_path):
    config = write_config(tmp_path, "FailingForwardPipeline", PROBE_PIPELINES,
                          args={"fail_at_block": 2, "frame_size": FRAME_SIZE,
                                "warmup_blocks": 2})  # warmup stops short of block 2

    result = ardiff(tmp_path, "rollout", config, "--frames", 12, "--json", "stats.json")

    assert result.exit_code == 1, result.stderr
    assert_one_error_line(result, "injected fault at block 2")
    frames, _rate = decode(tmp_path / "out.mp4")
    assert frames.shape[0] == 2 * FRAMES_PER_BLOCK
    stats = load_stats(tmp_path / "stats.json")
    assert (stats["status"], stats["exit_code"], stats["warnings"]) == ("failed", 1, [])
    assert "RuntimeError" in stats["error"] and "injected fault at block 2" in stats["error"]
    assert stats["frames"]["written"] == 4 == stats["outputs"][0]["frames"]
    assert stats["sessions"]["failed"] == 1


@pytest.mark.slow
def test_ctrl_c_leaves_a_playable_file_and_exit_130(tmp_path):
    marker = tmp_path / "blocks_done"
    config = write_config(tmp_path, "SlowPipeline",
                          args={"marker": str(marker), "sleep_s": 0.2})
    proc = subprocess.Popen([ARDIFF, "rollout", str(config), "--frames", "400", "--json",
                             "stats.json"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        done = _wait_for_blocks(marker, 2, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()

    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted by SIGINT"
    frames, _rate = decode(tmp_path / "out.mp4")
    assert (done - 1) * FRAMES_PER_BLOCK <= frames.shape[0] < 400
    assert frames.shape[0] % FRAMES_PER_BLOCK == 0
    assert greys(frames) == pytest.approx([i * GREY_STEP % 256 for i in range(len(frames))],
                                          abs=3)
    stats = load_stats(tmp_path / "stats.json")
    assert (stats["status"], stats["exit_code"], stats["error"]) == ("interrupted", 130,
                                                                     "interrupted by SIGINT")
    assert stats["outputs"][0]["frames"] == frames.shape[0]


def _wait_for_blocks(marker: Path, blocks: int, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        if marker.exists() and int(marker.read_text() or 0) >= blocks:
            return int(marker.read_text())
        time.sleep(0.02)
    raise AssertionError(f"the rollout made fewer than {blocks} blocks in 60 s")


# -- output of the command -----------------------------------------------------------------------
def test_json_dash_prints_only_json_on_stdout(tmp_path):
    config = write_config(tmp_path)

    result = ardiff(tmp_path, "rollout", config, "--frames", 4, "--json", "-")

    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stdout)  # the whole of stdout
    jsonschema.validate(stats, STATS_SCHEMA)
    assert (stats["status"], stats["exit_code"], stats["error"]) == ("ok", 0, None)
    assert stats["timing"]["real_time_factor"] > 0 and stats["kv"]["backend"] == "paged"
    assert "Rollout: ok" in result.stderr  # the summary moves to stderr


def test_quiet_prints_nothing(tmp_path):
    config = write_config(tmp_path)

    result = ardiff(tmp_path, "rollout", config, "--frames", 4, "--quiet", "--json", "stats.json")

    assert result.exit_code == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
    assert load_stats(tmp_path / "stats.json")["frames"]["written"] == 4


# -- refused before anything runs ----------------------------------------------------------------
REFUSALS = {
    "missing folder": ({}, ["-o", "missing/out.mp4", "--json", "stats.json"],
                       ["output.path", "does not exist"]),
    "bad suffix": ({}, ["-o", "out.avi"], ["output.path", "unsupported suffix '.avi'"]),
    "json folder": ({}, ["--json", "missing/stats.json"], ["--json", "does not exist"]),
    "max_model_len": ({"max_model_len": 8}, ["--frames", "20"],
                      ["rollout.frames: 20", "max_model_len is 8", "lower rollout.frames to 8"]),
    "interleave": ({"session_capacity": 2},
                   ["--set", "rollout.prompts=[a, b, c]", "--set", "rollout.interleave=true"],
                   ["rollout.interleave", "3 prompts", "session_capacity of 2", "keeps 2"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_is_refused_with_exit_2_before_anything_runs(tmp_path, case):
    args, flags, fragments = REFUSALS[case]
    log = tmp_path / "log.jsonl"
    config = write_config(tmp_path, args={"log": str(log), **args})

    result = ardiff(tmp_path, "rollout", config, *flags)

    assert result.exit_code == 2, result.output
    assert_one_error_line(result, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]  # no video, no block run


# -- #25: stdout is the JSON's alone; inputs checked where they enter ----------------------------
NOISY_PIPELINE = """
import ctypes
import os

from rollout_pipelines import RecordingPipeline


class NoisyPipeline(RecordingPipeline):
    \"\"\"Prints in load, warmup and every block: Python, a raw write to fd 1, C's printf.\"\"\"

    def say(self, where):
        print(f"python print in {where}")
        os.write(1, f"fd 1 write in {where}\\n".encode())
        ctypes.CDLL(None).printf(f"C printf in {where}\\n".encode())  # buffered by C's stdio

    def load(self, device, dtype):
        self.say("load")

    def ar_diffusion_warmup_requests(self, session_id):
        self.say("warmup")
        return super().ar_diffusion_warmup_requests(session_id)

    def generate_block(self, request, state):
        self.say("generate_block")
        return super().generate_block(request, state)


class ShortTextPipeline(RecordingPipeline):
    \"\"\"Declares a text length of 3 tokens, one token per word.\"\"\"

    max_prompt_tokens = 3

    def count_prompt_tokens(self, prompt):
        return len(prompt.split())
"""


def write_support_pipeline(tmp_path: Path, cls: str, **rollout) -> Path:
    (tmp_path / "extra_pipelines.py").write_text(NOISY_PIPELINE)
    return write_config(tmp_path, cls, tmp_path / "extra_pipelines.py", rollout=rollout)


def test_json_dash_stdout_is_the_json_alone_whatever_the_pipeline_prints(tmp_path, capfd):
    """In this process: Typer's runner holds Python's stdout and stderr, `capfd` the
    descriptors (a raw write and C's printf go to descriptor 2, not 1)."""
    config = write_support_pipeline(tmp_path, "NoisyPipeline")

    result = ardiff(tmp_path, "rollout", config, "--frames", 4, "--json", "-")

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["frames"]["written"] == 4  # the whole of stdout
    descriptors = capfd.readouterr()
    for where in ("load", "warmup", "generate_block"):
        assert f"python print in {where}" in result.stderr
        for how in ("fd 1 write", "C printf"):
            assert f"{how} in {where}" in descriptors.err
            assert f"{how} in {where}" not in descriptors.out


@pytest.mark.heavy  # a fresh interpreter: the JSON goes to a copy of the real descriptor 1
def test_the_installed_commands_stdout_is_the_json_alone(tmp_path):
    config = write_support_pipeline(tmp_path, "NoisyPipeline")
    env = {**ENV, "PYTHONPATH": str(TESTS_DIR / "support")}

    proc = subprocess.run([ARDIFF, "rollout", str(config), "--frames", "4", "--json", "-"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)  # the whole of stdout: nothing before or after
    assert (stats["status"], stats["frames"]["written"]) == ("ok", 4)
    for where in ("load", "warmup", "generate_block"):
        for how in ("python print", "fd 1 write", "C printf"):
            assert f"{how} in {where}" in proc.stderr


def test_flags_carry_any_unicode(tmp_path):
    log = tmp_path / "log.jsonl"
    config = write_config(tmp_path, args={"log": str(log)})
    (tmp_path / "prompts \U0001F600.txt").write_text("a \U0001F431 walks\n")
    (tmp_path / "actions \U0001F600.yaml").write_text("- \u00e9t\u00e9\n")

    result = ardiff(tmp_path, "rollout", config, "--frames", 2, "--prompts",
                    "prompts \U0001F600.txt", "--actions", "actions \U0001F600.yaml",
                    "-o", "out \U0001F600.npy")
    assert result.exit_code == 0, result.stderr
    assert [(b["prompt"], b["actions"]) for b in read_log(log)] == [("a \U0001F431 walks",
                                                                   ["\u00e9t\u00e9"])]
    assert (tmp_path / "out \U0001F600.npy").is_file()

    result = ardiff(tmp_path, "rollout", config, "--device", "cpu\U0001F600")
    assert result.exit_code == 2
    assert_one_error_line(result, "runtime.device: 'cpu\U0001F600' is not a device; use cpu")


def test_a_prompts_file_loses_its_bom_and_is_checked_as_inline_prompts_are(tmp_path):
    log = tmp_path / "log.jsonl"
    config = write_config(tmp_path, args={"log": str(log)})
    (tmp_path / "bom.txt").write_bytes("\ufeffa cat\n".encode())
    (tmp_path / "nul.txt").write_text("a cat\n\na\0dog\n")

    result = ardiff(tmp_path, "rollout", config, "--frames", 2, "--prompts", "bom.txt")
    assert result.exit_code == 0, result.stderr
    assert [b["prompt"] for b in read_log(log)] == ["a cat"]

    result = ardiff(tmp_path, "rollout", config, "--prompts", "nul.txt", "--json", "s.json")
    assert result.exit_code == 2, result.output
    assert_one_error_line(result, f"rollout.prompts ({tmp_path / 'nul.txt'}) line 3: "
                                  f"'a\\x00dog' holds a NUL character at character 1; remove it")
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "s.json").exists()


def test_actions_the_pipeline_does_not_know_are_refused_before_it_loads(tmp_path, monkeypatch):
    def must_not_load(*args):
        raise AssertionError("the pipeline was loaded before its actions were checked")

    monkeypatch.setattr("ardiff.pipelines.bouncing.pipeline.BouncingWorld.load", must_not_load)
    (tmp_path / "actions.yaml").write_text("- left\n- jump\n")

    result = ardiff(tmp_path, "rollout", "--actions", "actions.yaml", "--frames", 8,
                    "--json", "stats.json", "-o", "out.npy")

    assert result.exit_code == 2, result.output
    assert_one_error_line(result, f"rollout.actions ({tmp_path / 'actions.yaml'})[1]: 'jump' is "
                                  f"not an action of this pipeline; use one of none, left, "
                                  f"right, up, down")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actions.yaml"]  # no stats, no video


def test_a_prompt_longer_than_the_text_length_is_a_warning_naming_both(tmp_path):
    config = write_support_pipeline(tmp_path, "ShortTextPipeline",
                                    prompt="a cat walks on grass")

    result = ardiff(tmp_path, "rollout", config, "--frames", 2, "--json", "stats.json")

    assert result.exit_code == 0, result.stderr
    warning = ("rollout.prompt: 'a cat walks on grass' is 5 tokens, longer than the pipeline's "
               "text length of 3 tokens; the model sees only the first 3")
    assert f"warning: {warning}" in result.stderr.splitlines()
    assert load_stats(tmp_path / "stats.json")["warnings"] == [warning]


def test_timeline_writes_a_json_line_per_block_and_the_json_lists_them(tmp_path):
    result = ardiff(tmp_path, "rollout", "--frames", 6, "--timeline", "t.jsonl",
                    "--json", "stats.json", "-o", "out.npy")

    assert result.exit_code == 0, result.stderr
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["block"] for r in records] == list(range(6))  # the default: a frame per block
    assert load_stats(tmp_path / "stats.json")["blocks"] == records
    assert {"denoise_s", "commit_s", "other_s", "encode_wait_s", "pages_in_use"} <= set(
        records[0])


def test_a_timeline_path_is_checked_before_the_run(tmp_path):
    result = ardiff(tmp_path, "rollout", "--frames", 2, "--timeline", "missing/t.jsonl",
                    "-o", "out.npy")
    assert result.exit_code == 2
    assert_one_error_line(result, "--timeline", "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_prompt_to_the_default_model_is_a_warning_in_the_terminal_and_json(tmp_path):
    result = ardiff(tmp_path, "rollout", "--prompt", "a red ball", "--frames", 2,
                    "--json", "stats.json", "-o", "out.npy")

    assert result.exit_code == 0, result.stderr
    warning = ("rollout.prompt: given, but this pipeline ignores prompts (its inputs declare "
               "prompt: ignored); the video does not depend on it; remove rollout.prompt")
    assert f"warning: {warning}" in result.stderr.splitlines()
    assert warning in load_stats(tmp_path / "stats.json")["warnings"]


# -- the CI script ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.heavy  # four fresh interpreters, one per command of the script
def test_the_ci_smoke_script_passes_on_the_shipped_tiny_dit(tmp_path):
    env = {**ENV, "PATH": f"{BIN_DIR}{os.pathsep}{ENV.get('PATH', '')}"}

    result = subprocess.run(["bash", str(REPO / "examples" / "ci_smoke.sh")], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "ci_smoke: ok" in result.stdout
    assert load_stats(tmp_path / "stats.json")["status"] == "ok"
    assert decode(tmp_path / "smoke.mp4")[0].shape[0] > 0
