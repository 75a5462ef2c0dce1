"""ardiff/rollout/paths.py: the paths a run reads and writes, checked before any compute.

Library first (odd path strings, one file through many spellings, the collision
messages), then what a user sees: `run_rollout` refusing a collision before the
pipeline runs, and `ardiff rollout` (in-process, Typer's runner) refusing `--json` or
an output that is an input, and expanding `~` in every path it reads. The one-line
messages of these refusals through the CLI are also rows of the bad-input catalogue
(tests/support/catalogue_cases.py).
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml
from fifos import late_reader, read_fifo
from typer.testing import CliRunner

from ardiff.config.run import build_config
from ardiff.errors import ConfigError, OutputPathError
from ardiff.path_text import check_path_text
from ardiff.rollout.inputs import output_path_for, read_actions, read_prompts
from ardiff.rollout.job import run_rollout
from ardiff.rollout.paths import check_rollout_paths, check_run_paths, is_same_file
from ardiff.video import disk
from ardiff_cli.main import app

SUPPORT = Path(__file__).parents[1] / "support"
RECORDING = SUPPORT / "rollout_pipelines.py"

NEEDS_PLOT = pytest.mark.extra("plot")  # a --report picture is drawn by matplotlib


def make_config(folder: Path, output: str = "out.npy", **rollout):
    data = {"pipeline": {"entry": f"{RECORDING}:RecordingPipeline",
                         "args": {"log": str(folder / "log.jsonl")}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": 4, "prompt": "p", **rollout},
            "output": {"path": output, "fps": 8}}
    return build_config(data, base_dir=folder)


def write_config(folder: Path, output: str = "out.npy", **rollout) -> Path:
    data = {"pipeline": {"entry": f"{RECORDING}:RecordingPipeline", "args": {}},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": 4, "prompt": "p", **rollout},
            "output": {"path": output, "fps": 8}}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def ardiff(cwd: Path, *args: object):
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


# -- one path string ---------------------------------------------------------------------------
@pytest.mark.parametrize("field, text, error, message", [
    ("output.path", "", OutputPathError, r"^output\.path: '' is empty; give a file name like "
                                         r"'out\.mp4'$"),
    ("output.path", "   ", OutputPathError, r"^output\.path: '   ' is blank"),
    ("output.path", "a\0.mp4", OutputPathError, r"^output\.path: 'a\\x00\.mp4' holds a NUL "
                                                r"byte \(\\0\), which no file name can; remove"),
    ("--json", "", OutputPathError, r"^--json: '' is empty; give a file name like 'stats\.json'"),
    ("--json", "runs/", OutputPathError, r"^--json: 'runs/' names a folder, and a file is "
                                         r"needed here; give a file name like "
                                         r"'runs/stats\.json'$"),
    ("--json", ".", OutputPathError, r"^--json: '\.' names a folder"),
    ("--json", "a/..", OutputPathError, r"^--json: 'a/\.\.' names a folder"),
    ("rollout.prompts", "\t", ConfigError, r"^rollout\.prompts: '\\t' is blank; give a file "
                                           r"name like 'prompts\.txt'$"),
    ("rollout.actions", "moves/", ConfigError, r"^rollout\.actions: 'moves/' names a folder"),
])
def test_a_path_no_file_can_have_is_refused_naming_field_and_value(field, text, error, message):
    with pytest.raises(error, match=message) as caught:
        check_path_text(field, text)
    assert isinstance(caught.value, error) and "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["frames/", ".", "..", "out.mp4", "runs/{index}.mkv"])
def test_an_output_may_name_a_folder(text):
    check_path_text("output.path", text, file_needed=False)  # a PNG folder: no error


def test_an_output_template_is_checked_and_its_tilde_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert output_path_for("~/clips/out-{index}.mp4", 1, 2) == tmp_path / "clips" / "out-1.mp4"
    with pytest.raises(OutputPathError, match=r"^output\.path: '' is empty"):
        output_path_for("", 0, 1)


def test_prompt_and_action_files_expand_tilde_and_refuse_odd_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "prompts.txt").write_text("a\nb\n")
    (tmp_path / "actions.yaml").write_text("[left, right]\n")
    elsewhere = tmp_path / "elsewhere"
    assert read_prompts("~/prompts.txt", elsewhere) == ["a", "b"]
    assert read_actions("~/actions.yaml", elsewhere) == (("left",), ("right",))
    with pytest.raises(ConfigError, match=r"^rollout\.prompts: 'lists/' names a folder"):
        read_prompts("lists/", tmp_path)
    with pytest.raises(ConfigError, match=r"^rollout\.actions: '' is empty"):
        read_actions("", tmp_path)


# -- one file, many spellings ----------------------------------------------------------------
def test_one_file_is_one_file_whatever_the_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "sub").mkdir()
    (tmp_path / "run.yaml").write_text("x")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "run.yaml")
    os.link(tmp_path / "run.yaml", tmp_path / "hard.yaml")
    for spelling in ["run.yaml", "./run.yaml", "sub/../run.yaml", str(tmp_path / "run.yaml"),
                     "~/run.yaml", "link.yaml", "hard.yaml", Path("run.yaml")]:
        assert is_same_file(spelling, "run.yaml"), spelling
    assert is_same_file("new.mp4", str(tmp_path / "sub" / ".." / "new.mp4"))  # neither exists
    assert not is_same_file("run.yaml", "sub/run.yaml")
    assert not is_same_file("new.mp4", "run.yaml")


# -- collisions ----------------------------------------------------------------------------
def test_an_output_that_is_an_input_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("x")
    with pytest.raises(OutputPathError, match=r"^output\.path: 'run\.yaml' is the same file as "
                                              r"config 'run\.yaml'; the run would overwrite its "
                                              r"input; pick another name, like 'out\.mp4'$"):
        check_run_paths([("output.path", "run.yaml")], [("config", "run.yaml")])


def test_two_written_paths_that_are_one_file_are_refused_with_both_spellings(tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputPathError) as caught:
        check_run_paths([("output.path", "out.mp4"), ("--json", "./out.mp4")], [])
    assert str(caught.value) == (
        f"--json: './out.mp4' is the same file as output.path 'out.mp4' (both are "
        f"'{tmp_path / 'out.mp4'}'); the run would write it twice, and one would be lost; "
        f"pick another name, like 'stats.json'")


def test_distinct_paths_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_run_paths([("output.path", "a.mp4"), ("output.path", "b.mp4"), ("--json", "s.json")],
                    [("config", "run.yaml"), ("rollout.prompts", "p.txt")])


def test_inputs_resolve_against_the_config_folder_and_outputs_against_the_cwd(tmp_path,
                                                                            monkeypatch):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "prompts.txt").write_text("a\n")
    monkeypatch.chdir(tmp_path)
    config = make_config(configs, output="configs/prompts.txt", prompts="prompts.txt")
    with pytest.raises(OutputPathError, match=r"^output\.path: 'configs/prompts\.txt' is the "
                                              r"same file as rollout\.prompts '.*prompts\.txt'"):
        check_rollout_paths(config)
    check_rollout_paths(make_config(configs, output="prompts.txt", prompts="prompts.txt"))


def test_two_streams_that_would_write_one_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = make_config(tmp_path, output="x{index}/../out.mp4", prompts=["a", "b"])
    with pytest.raises(OutputPathError, match=r"^output\.path: two streams would write one "
                                              r"file, 'x0/\.\./out\.mp4' and 'x1/\.\./out\.mp4'"):
        check_rollout_paths(config)


def test_run_rollout_refuses_an_output_that_is_its_actions_file_before_any_block(tmp_path):
    actions = tmp_path / "moves.npy"
    actions.write_text("[left]\n")  # YAML, with a name the writer would take for a video
    config = make_config(tmp_path, output=str(actions), actions=str(actions))

    with pytest.raises(OutputPathError, match=r"^output\.path: '.*moves\.npy' is the same file "
                                              r"as rollout\.actions"):
        run_rollout(config)
    assert actions.read_text() == "[left]\n"
    assert not (tmp_path / "log.jsonl").exists()  # no block ran


# -- through the command line --------------------------------------------------------------
def test_json_that_is_the_config_through_a_symlink_is_refused_and_nothing_changes(tmp_path):
    config = write_config(tmp_path)
    (tmp_path / "stats.json").symlink_to(config)
    before = config.read_text()

    result = ardiff(tmp_path, "rollout", "run.yaml", "--json", "stats.json")

    assert result.exit_code == 2
    assert result.stderr.startswith("error: --json: 'stats.json' is the same file as config "
                                    "'run.yaml' (both are ")
    assert config.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml", "stats.json"]


def test_every_path_the_command_reads_or_writes_expands_tilde(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    write_config(home, output="~/out.npy", prompts="~/prompts.txt")
    (home / "prompts.txt").write_text("a\n")
    (home / "actions.yaml").write_text("[left]\n")

    result = ardiff(tmp_path, "rollout", "~/run.yaml", "--actions", "~/actions.yaml",
                    "--json", "~/stats.json", "--quiet")

    assert result.exit_code == 0, result.stderr
    assert np.load(home / "out.npy").shape[0] == 4
    assert json.loads((home / "stats.json").read_text())["outputs"][0]["frames"] == 4
    assert not (tmp_path / "~").exists()


def test_a_prompt_may_hold_a_line_separator_or_form_feed(tmp_path):
    (tmp_path / "prompts.txt").write_text("a cat\u2028on a mat\nits\x0cshadow\r\n# note\n\n")
    assert read_prompts("prompts.txt", tmp_path) == ["a cat\u2028on a mat", "its\x0cshadow"]


def test_an_actions_message_does_not_grow_with_the_input(tmp_path):
    with pytest.raises(ConfigError) as info:
        read_actions([["left", 3] * 10_000], tmp_path)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("flag, name", [("-o", "a" * 204 + ".mp4"),
                                        ("--json", "é" * 110 + ".json")])
def test_a_written_name_with_no_room_for_its_work_file_is_refused_before_compute(tmp_path, flag,
                                                                                 name):
    write_config(tmp_path)
    result = ardiff(tmp_path, "rollout", "run.yaml", flag, name)
    assert result.exit_code == 2
    field = "output.path" if flag == "-o" else "--json"
    size = len(name.encode())
    assert re.match(rf"^error: {re.escape(field)}: '.*' has a name of {size} bytes; it is "
                    rf"written through a work file whose name adds up to 48 bytes and file "
                    rf"systems allow 255, so give a name of at most 207 bytes$", result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


def test_a_json_symlink_into_a_missing_folder_is_refused_before_compute(tmp_path):
    write_config(tmp_path)
    (tmp_path / "stats.json").symlink_to(tmp_path / "gone" / "x.json")
    result = ardiff(tmp_path, "rollout", "run.yaml", "--json", "stats.json")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --json: 'stats.json' is in a folder that does not "
                                    f"exist ({str(tmp_path / 'gone')!r})")
    assert not (tmp_path / "out.npy").exists()


# -- #25: every path a command writes, against every path it reads and each other ------------
READS_PIPELINE = '''
from rollout_pipelines import RecordingPipeline


class Reads(RecordingPipeline):
    """Declares the files it reads, as a pipeline with weights would."""

    def __init__(self, weights="w.pt", model="model", **args):
        super().__init__(**args)
        self.weights, self.model = weights, model

    def ar_diffusion_input_paths(self):
        return {"pipeline.args.weights": self.weights, "pipeline.args.model": self.model,
                "pipeline.args.lora": None}
'''


def plugin_folder(folder: Path, **args) -> Path:
    """A config whose pipeline is a file beside it (reads.py: it declares what it reads)."""
    (folder / "reads.py").write_text(READS_PIPELINE)
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text("{}")
    data = {"pipeline": {"entry": "reads.py:Reads", "args": args},
            "runtime": {"device": "cpu", "memory_budget": "16MiB"},
            "rollout": {"frames": 4, "prompt": "p"}, "output": {"path": "out.npy", "fps": 8}}
    (folder / "run.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "run.yaml"


def tree(folder: Path) -> dict[str, str]:
    """Every path under `folder` (links as links) with what it holds: nothing may change."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(folder))
        out[name] = (f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir()
                     else path.read_bytes().hex() if path.is_file() else "other")
    return out


@pytest.mark.parametrize("args, links, message", [
    (("--json", "reads.py"), (), r"--json: 'reads\.py' is the same file as pipeline\.entry "
                                 r"'.*reads\.py' \(both are .*\); the run would overwrite its "
                                 r"input; pick another name, like 'stats\.json'"),
    (("-o", "w.npy", "--set", "pipeline.args.weights=w.npy"), (),
     r"output\.path: 'w\.npy' is the same file as pipeline\.args\.weights 'w\.npy'; the run "
     r"would overwrite its input; pick another name, like 'out\.mp4'"),
    (("--json", "model/config.json"), (), r"--json: 'model/config\.json' is inside "
                                          r"pipeline\.args\.model 'model', a folder the run "
                                          r"reads; the run would overwrite its input"),
    (("-o", "model"), (), r"output\.path: 'model' is the same file as pipeline\.args\.model"),
    pytest.param(("--report", "r.svg", "--json", "r.svg"), (),
     r"--report: 'r\.svg' is the same file as --json 'r\.svg'; the run would write it twice, "
     r"and one would be lost; pick another name, like 'run\.png'", marks=NEEDS_PLOT),
    pytest.param(("--report", "link.png"), (("link.png", "run.yaml"),),
     r"--report: 'link\.png' is the same file as config 'run\.yaml' \(both are .*\); the run "
     r"would overwrite its input; pick another name, like 'run\.png'", marks=NEEDS_PLOT),
    pytest.param(("--report", "link.svg"), (("link.svg", "reads.py"),),
     r"--report: 'link\.svg' is the same file as pipeline\.entry", marks=NEEDS_PLOT),
    pytest.param(("--report", "link.html"), (("link.html", "gone/r.html"),),
     r"--report: 'link\.html' is in a folder that does not exist \('.*gone'\); create it first",
     marks=NEEDS_PLOT),
    (("-o", "link.npy"), (("link.npy", "gone/v.npy"),),
     r"output\.path: 'link\.npy' is in a folder that does not exist \('.*gone'\)"),
    (("-o", "-"), (), r"output\.path: '-' is not stdout here \(only --json - is\): it would "
                      r"name a folder of PNG frames called '-'; give a file name like "
                      r"'out\.mp4', or '\./-' to mean that folder"),
])
def test_a_written_path_that_is_read_or_written_twice_is_refused_before_any_work(
        tmp_path, args, links, message):
    plugin_folder(tmp_path)
    for name, target in links:
        (tmp_path / name).symlink_to(tmp_path / target)
    before = tree(tmp_path)

    result = ardiff(tmp_path, "rollout", "run.yaml", "--quiet", *args)

    assert result.exit_code == 2, result.output
    assert re.fullmatch(f"error: {message}.*\n", result.stderr), result.stderr
    assert tree(tmp_path) == before  # no video, no stats, no picture, no folder '-'


def test_run_rollout_refuses_an_output_that_is_a_file_the_pipeline_reads(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin_folder(tmp_path)
    (tmp_path / "weights.npy").write_bytes(b"weights")
    config = build_config({"pipeline": {"entry": "reads.py:Reads",
                                        "args": {"weights": "weights.npy", "log": "log.jsonl"}},
                           "runtime": {"device": "cpu", "memory_budget": "16MiB"},
                           "rollout": {"frames": 4, "prompt": "p"},
                           "output": {"path": str(tmp_path / "weights.npy"), "fps": 8}},
                          base_dir=tmp_path)
    with pytest.raises(OutputPathError, match=r"^output\.path: '/.*/weights\.npy' is the same "
                                              r"file as pipeline\.args\.weights 'weights\.npy' "
                                              r"\(both are"):
        run_rollout(config)
    assert (tmp_path / "weights.npy").read_bytes() == b"weights"
    assert not (tmp_path / "log.jsonl").exists()


def test_a_new_file_in_a_folder_the_pipeline_reads_may_be_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plugin_folder(tmp_path)
    config = build_config({"pipeline": {"entry": "reads.py:Reads", "args": {}},
                           "rollout": {"frames": 4, "prompt": "p"},
                           "output": {"path": "model/new.npy"}}, base_dir=tmp_path)
    from ardiff.engine.loader import build_pipeline

    check_rollout_paths(config, pipeline=build_pipeline(config.pipeline, tmp_path))


# -- an output that is a symlink, a FIFO or a device: written through, never replaced ---------
def test_a_video_through_a_symlink_replaces_the_target_and_the_link_stays(tmp_path):
    write_config(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "v.npy").write_text("old")
    (tmp_path / "v.npy").symlink_to(tmp_path / "real" / "v.npy")

    result = ardiff(tmp_path, "rollout", "run.yaml", "-o", "v.npy", "--quiet")

    assert result.exit_code == 0, result.output
    assert (tmp_path / "v.npy").is_symlink()
    assert np.load(tmp_path / "real" / "v.npy").shape[0] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real", "run.yaml", "v.npy"]
    assert os.listdir(tmp_path / "real") == ["v.npy"]  # no work file left beside it


def test_a_video_into_a_fifo_is_written_through_and_the_fifo_stays(tmp_path):
    write_config(tmp_path)
    os.mkfifo(tmp_path / "v.npy")
    got: list[bytes] = []
    reader = read_fifo(tmp_path / "v.npy", got)

    result = ardiff(tmp_path, "rollout", "run.yaml", "-o", "v.npy", "--json", "s.json",
                    "--quiet")

    reader.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(tmp_path / "v.npy").st_mode)
    assert np.load(io.BytesIO(got[0])).shape[0] == 4
    outputs = json.loads((tmp_path / "s.json").read_text())["outputs"]
    assert outputs[0]["frames"] == 4 and outputs[0]["bytes"] == len(got[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml", "s.json", "v.npy"]


def test_a_video_into_a_fifo_nobody_reads_fails_soon_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "STREAM_WAIT_S", 0.2)
    write_config(tmp_path)
    os.mkfifo(tmp_path / "v.npy")

    with late_reader(tmp_path / "v.npy"):
        result = ardiff(tmp_path, "rollout", "run.yaml", "-o", "v.npy", "--quiet")

    assert result.exit_code == 1
    line, = result.stderr.splitlines()
    assert line.startswith("error: output.path: writing 'v.npy' (npy) failed after 4 frames "
                           "(TimeoutError: no reader opened it within 0.2 s); no frame could "
                           "be kept and 'v.npy' was not changed"), line
    assert line.endswith("; 'v.npy' is a FIFO that no process reads: start its reader first")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "v.npy").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml", "v.npy"]


@NEEDS_PLOT
def test_a_picture_into_a_fifo_reaches_its_reader_whole(tmp_path):
    write_config(tmp_path)
    os.mkfifo(tmp_path / "r.png")
    got: list[bytes] = []
    reader = read_fifo(tmp_path / "r.png", got)

    result = ardiff(tmp_path, "rollout", "run.yaml", "--report", "r.png", "--quiet")

    reader.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert got[0].startswith(b"\x89PNG\r\n\x1a\n") and got[0].endswith(b"IEND\xaeB`\x82")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "r.png").st_mode)


@pytest.mark.parametrize("field, text, message", [
    ("output.path", "-", "output.path: '-' is not stdout here (only --json - is): it would name "
                         "a folder of PNG frames called '-'; give a file name like 'out.mp4', "
                         "or './-' to mean that folder"),
    ("--actions-out", "-", "--actions-out: '-' is not stdout here (only --json - is): it would "
                           "name a file called '-'; give a file name like 'play.actions.yaml'"),
])
def test_an_output_typed_as_a_dash_is_not_stdout(field, text, message):
    with pytest.raises(OutputPathError) as caught:
        check_path_text(field, text, file_needed=False)
    assert str(caught.value) == message
    check_path_text(field, Path("./-"), file_needed=False)  # planned: a file or folder '-'


def test_a_png_folder_named_dash_is_spelled_dot_slash_dash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = make_config(tmp_path, output="./-")
    check_rollout_paths(config)
    assert output_path_for("./-", 0, 1) == Path("-")


def test_a_json_path_too_long_for_any_file_system_is_one_line(tmp_path):
    write_config(tmp_path)
    result = ardiff(tmp_path, "rollout", "run.yaml", "--json", "/".join(["d" * 200] * 25))
    assert result.exit_code == 2
    assert re.fullmatch(r"error: --json: 'd+\.\.\.d+' is 5024 bytes long; file systems allow "
                        r"4095, so pick a shorter path\n", result.stderr), result.stderr



@pytest.mark.parametrize("flag, name", [("-o", "loop.npy"), ("--json", "loop.json"),
                                        pytest.param("--report", "loop.svg",
                                                     marks=NEEDS_PLOT)])
def test_an_output_that_is_a_loop_of_symlinks_is_refused_and_the_links_stay(tmp_path, flag,
                                                                             name):
    write_config(tmp_path)
    (tmp_path / name).symlink_to(f"2{name}")
    (tmp_path / f"2{name}").symlink_to(name)
    video = () if flag == "-o" else ("-o", "out.npy")

    result = ardiff(tmp_path, "rollout", "run.yaml", flag, name, *video, "--quiet")

    field = {"-o": "output.path"}.get(flag, flag)
    assert result.exit_code == 2, result.output
    assert re.fullmatch(rf"error: {re.escape(field)}: '{re.escape(name)}' is a loop of "
                        rf"symlinks \(it leads to no file\); remove the link or pick another "
                        rf"path\n", result.output), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"2{name}", name, "run.yaml"]
    assert (tmp_path / name).is_symlink() and (tmp_path / f"2{name}").is_symlink()


def test_a_png_folder_that_holds_an_input_named_like_a_frame_is_refused(tmp_path):
    write_config(tmp_path)
    (tmp_path / "frames").mkdir()
    (tmp_path / "frames" / "frame_000000.png").write_text("a prompt\n")
    (tmp_path / "frames" / "notes.txt").write_text("another prompt\n")

    refused = ardiff(tmp_path, "rollout", "run.yaml", "-o", "frames/", "--prompts",
                     "frames/frame_000000.png", "--quiet")
    kept = ardiff(tmp_path, "rollout", "run.yaml", "-o", "frames/", "--prompts",
                  "frames/notes.txt", "--quiet")

    assert refused.exit_code == 2, refused.output
    assert refused.output == (
        "error: output.path: 'frames' is a folder of PNG frames that holds rollout.prompts "
        "'frame_000000.png'; the run replaces every frame_*.png in it, so it would "
        "overwrite its input; move the input or pick another folder\n")
    assert kept.exit_code == 0, kept.output  # a file no frame is named like stays
    assert (tmp_path / "frames" / "notes.txt").read_text() == "another prompt\n"
    assert (tmp_path / "frames" / "frame_000000.png").read_bytes().startswith(b"\x89PNG")


def test_play_refuses_a_video_that_is_a_loop_of_symlinks_before_it_needs_a_terminal(tmp_path):
    (tmp_path / "game.npy").symlink_to("game.npy")

    result = ardiff(tmp_path, "play", "-o", "game.npy")

    assert result.exit_code == 2, result.output
    assert result.output == ("error: output.path: 'game.npy' is a loop of symlinks (it leads "
                             "to no file); remove the link or pick another path\n")
    assert [p.name for p in tmp_path.iterdir()] == ["game.npy"]


def test_a_png_folder_refuses_a_json_named_like_one_of_its_frames(tmp_path):
    write_config(tmp_path)
    (tmp_path / "frames").mkdir()

    result = ardiff(tmp_path, "rollout", "run.yaml", "-o", "frames/", "--json",
                    "frames/frame_000001.png", "--quiet")

    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: output.path: 'frames' is a folder of PNG frames that holds --json "
        "'frame_000001.png'; the run replaces every frame_*.png in it, so it would write it "
        "twice, and one would be lost; move the file or pick another folder\n")
    assert os.listdir(tmp_path / "frames") == []
