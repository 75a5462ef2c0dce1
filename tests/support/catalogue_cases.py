"""The bad-input catalogue's table: every way to get the input of `ardiff` wrong, the
exit code and the message it must give. tests/cli/test_catalogue.py runs each case and checks
the "Bad input" table of docs/errors.md against it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ardiff.pipelines.causal_wan.make_tiny import TINY_TRANSFORMER, TINY_VAE

BASE = {"pipeline": {"entry": "fault_pipelines.py:FaultPipeline", "args": {}},
        "runtime": {"device": "cpu", "memory_budget": "16MiB"},
        "rollout": {"frames": 4, "prompt": "a red ball"},
        "output": {"path": "out.mp4", "fps": 8}}
READ_ONLY = "ro"          # the folder of the "not writable" case
NO_CUDA = "no-cuda"       # a case that needs a machine without CUDA
# causal-Wan on a folder holding only its two config.json files: it constructs (no weights)
CAUSAL_WAN = "ardiff.pipelines.causal_wan:CausalWan"
TINY_WAN = {"model_dir": "wan", "height": 48, "width": 64}
WAN_CONFIGS = (("wan/transformer/config.json", json.dumps(TINY_TRANSFORMER)),
               ("wan/vae/config.json", json.dumps(TINY_VAE)))
LISTS_INPUTS = """import ardiff


class ListsInputs(ardiff.ARDiffusionPipelineBase):
    def ar_diffusion_kv_cache_spec(self):
        raise NotImplementedError

    def generate_block(self, request, state):
        raise NotImplementedError

    def ar_diffusion_input_paths(self):
        return ["weights.pt"]
"""


@dataclass(frozen=True)
class Case:
    """One bad input: what is wrong, the exit code and a regex the `error:` line matches."""

    problem: str                  # the docs/errors.md row
    code: int
    pattern: str                  # searched in the message (after "error: ")
    args: tuple[str, ...] = ()    # after `ardiff COMMAND CONFIG`
    config: dict | str | bytes | None = None  # a dict merges into BASE; str/bytes: the file
    files: tuple[tuple[str, str | bytes], ...] = ()  # more inputs beside run.yaml
    command: str = "rollout"
    config_arg: str = "run.yaml"
    needs: str | None = None      # READ_ONLY or NO_CUDA
    extra: str | None = None      # the optional extra the case needs (skipped without it)
    exact: bool = True            # False: the message has machine-specific text
    subprocess: bool = False      # also run through the installed command (slow: keep few)

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.problem.lower()).strip("-")


def entry(value: str, **args) -> dict:
    return {"pipeline": {"entry": value, "args": args}}


def args_of(**args) -> dict:
    return {"pipeline": {"args": args}}


def rollout(**values) -> dict:
    return {"rollout": values}


CASES = [
    # -- the config file --------------------------------------------------------------------
    Case("config file missing", 2, r"^config: 'nope\.yaml' does not exist or is not a file; "
         r"check the path", config_arg="nope.yaml", subprocess=True),
    Case("config file not UTF-8", 2, r"^config: cannot read 'run\.yaml' \(UnicodeDecodeError: "
         r".*\); give a UTF-8 YAML file", config=b"pipeline: \xff\xfe\n"),
    Case("YAML syntax error", 2, r"^run\.yaml: YAML syntax error at line 3, column 2: .*; fix "
         r"the YAML there", config="pipeline:\n  entry: fault_pipelines.py:FaultPipeline\n"
         " args: {}\n"),
    Case("top level not a mapping", 2, r"^run\.yaml: the top level must be a mapping of "
         r"sections \(pipeline, runtime, \.\.\.\), got list", config="- pipeline\n- runtime\n"),
    Case("required key missing", 2, r"^pipeline: required key is missing; add it",
         config="rollout: {frames: 4}\n"),
    Case("unknown key", 2, r"^rollout\.frams: unknown key; did you mean 'frames'\?",
         config=rollout(frams=4)),
    Case("unknown section", 2, r"^video: unknown key; known keys: pipeline, runtime, warmup, "
         r"rollout, output, play", config={"video": {"fps": 8}}),
    Case("wrong type", 2, r"^rollout\.frames: expected an integer, got 'many' \(str\)",
         config=rollout(frames="many")),
    Case("wrong type of section", 2, r"^runtime: expected a mapping of keys, got 'cpu' \(str\)",
         config={"runtime": "cpu"}),
    Case("value not one of the choices", 2, r"^runtime\.kv\.backend: 'flat' \(str\) is not "
         r"allowed; use one of 'paged', 'dense'", config={"runtime": {"kv": {"backend": "flat"}}}),
    Case("prompt schedule not starting at frame 0", 2, r"^rollout\.prompt: a schedule must "
         r"start at frame 0, got frames \[8\]; add \{frame: 0",
         config=rollout(prompt=[{"frame": 8, "prompt": "a"}])),
    # -- counts and sizes -------------------------------------------------------------------
    Case("`--frames 0`", 2, r"^rollout\.frames: 0 is invalid; it must be > 0",
         args=("--frames", "0")),
    Case("`--frames -3`", 2, r"^rollout\.frames: -3 is invalid; it must be > 0",
         args=("--frames", "-3")),
    Case("zero sessions", 2, r"^runtime\.max_sessions: 0 is invalid; it must be > 0",
         config={"runtime": {"max_sessions": 0}}),
    Case("zero window", 2, r"^runtime\.kv\.window_frames: 0 is invalid; it must be > 0",
         args=("--set", "runtime.kv.window_frames=0")),
    Case("negative sink", 2, r"^runtime\.kv\.sink_frames: -1 is invalid; it must be >= 0",
         config={"runtime": {"kv": {"sink_frames": -1}}}),
    Case("zero denoising steps", 2, r"^rollout\.num_steps: 0 is invalid; it must be > 0",
         config=rollout(num_steps=0)),
    Case("`--fps 0`", 2, r"^output\.fps: 0\.0 must be > 0; try 16", args=("--fps", "0")),
    Case("malformed size", 2, r"^runtime\.memory_budget: 'lots' is not a size; write bytes like "
         r"6GiB", args=("--budget", "lots")),
    Case("unknown size unit", 2, r"^runtime\.memory_budget: '12XB' has unknown unit 'XB'; use "
         r"one of B, KB", args=("--budget", "12XB")),
    Case("zero budget", 2, r"^runtime\.memory_budget: '0' must be more than 0 bytes",
         args=("--budget", "0")),
    Case("budget neither fraction nor bytes", 2, r"^runtime\.memory_budget: 1\.5 is neither a "
         r"fraction in \(0, 1\] nor a whole number of bytes", config={"runtime": {
             "memory_budget": 1.5}}),
    # -- several processes (runtime.parallel) -----------------------------------------------
    Case("more workers than prompts", 2, r"^runtime\.parallel\.workers: 2 replicas for 1 "
         r"prompt\(s\) would leave 1 idle; use at most 1", args=("--workers", "2")),
    Case("CFG-parallel of 3", 2, r"^runtime\.parallel\.cfg: 3 is invalid; CFG-parallel splits "
         r"the two guidance branches", args=("--cfg-parallel", "3")),
    Case("CFG-parallel, pipeline without support", 2, r"^runtime\.parallel\.cfg: 2 needs a "
         r"pipeline that runs one CFG branch per rank \(bind_ar_diffusion_parallel\); "
         r"FaultPipeline has none", args=("--cfg-parallel", "2")),
    Case("CFG-parallel with one branch", 2, r"^runtime\.parallel\.cfg: 2 runs one CFG branch "
         r"per rank, but the pipeline declares 1 branch\(es\) \['main'\]",
         config={**entry("ardiff.pipelines.tiny_dit:TinyCausalDiT"), **rollout(
             guidance_scale=3.0)}, args=("--cfg-parallel", "2")),
    Case("CFG-parallel without guidance", 2, r"^runtime\.parallel\.cfg: 2 runs the negative "
         r"branch on its own rank, but rollout\.guidance_scale is 1 \(no guidance\)",
         config=entry("ardiff.pipelines.tiny_dit:TinyCausalDiT", cfg=True),
         args=("--cfg-parallel", "2")),
    # -- the pipeline entry point and its spec --------------------------------------------
    Case("entry module missing", 2, r"^pipeline\.entry: module 'no_such_module' not found; "
         r"check the spelling or install", config=entry("no_such_module:Pipeline")),
    Case("entry file missing", 2, r"^pipeline\.entry: file 'missing\.py' not found \(paths are "
         r"relative to the config file's folder", config=entry("missing.py:Pipeline")),
    Case("entry attribute missing", 2, r"^pipeline\.entry: '.*fault_pipelines\.py' has no "
         r"attribute 'Nope'; it defines: .*FaultPipeline",
         config=entry("fault_pipelines.py:Nope"), exact=False),
    Case("entry malformed", 2, r"^pipeline\.entry: ':Pipeline' is malformed; write "
         r"package\.module:attr", config=entry(":Pipeline")),
    Case("entry not a registered name", 2, r"^pipeline\.entry: 'no-such-model' is not a "
         r"registered pipeline \(known: .*\); use package\.module:attr",
         config=entry("no-such-model"), exact=False),
    Case("entry not callable", 2, r"^pipeline\.entry: 'spec_pipelines\.py:NOT_CALLABLE' is a "
         r"int, not a class or factory", config=entry("spec_pipelines.py:NOT_CALLABLE")),
    Case("entry file raises on import", 2, r"^pipeline\.entry: running 'broken\.py' raised "
         r"ImportError: this model needs flash_attn", config=entry("broken.py:Pipeline"),
         files=(("broken.py", "raise ImportError('this model needs flash_attn')\n"),)),
    Case("constructor raises", 2, r"^pipeline: constructing "
         r"'spec_pipelines\.py:ConstructorRaisesPipeline' with args \{\} raised ValueError: no "
         r"such checkpoint", config=entry("spec_pipelines.py:ConstructorRaisesPipeline")),
    Case("unknown pipeline argument", 2, r"^pipeline: constructing "
         r"'fault_pipelines\.py:FaultPipeline' with args \{'colour': 3\} raised TypeError: "
         r".*unexpected keyword argument 'colour'", args=("--set", "pipeline.args.colour=3")),
    Case("object lacks protocol methods", 2, r"^pipeline: "
         r"'spec_pipelines\.py:MissingMethodsPipeline' built a MissingMethodsPipeline that lacks "
         r"bind_ar_diffusion_state, close_ar_diffusion_session, generate_block; implement "
         r"SupportsARDiffusionPipeline and SupportsARDiffusionBlockGeneration$",
         config=entry("spec_pipelines.py:MissingMethodsPipeline")),
    Case("bad video_frames_per_latent_frame", 2, r"^pipeline: video_frames_per_latent_frame is "
         r"0; it must be an integer >= 1", config=args_of(video_frames_per_latent_frame=0)),
    Case("invalid spec", 2, r"^spec\.num_layers: 0 is invalid; it must be an integer > 0",
         config=entry("spec_pipelines.py:InvalidSpecPipeline")),
    Case("invalid spec from pipeline args", 2, r"^pipeline: constructing "
         r"'fault_pipelines\.py:FaultPipeline' with args \{'frames_per_block': 0\} raised "
         r"SpecError: spec\.frames_per_block: 0 is invalid; it must be an integer > 0",
         config=args_of(frames_per_block=0)),
    Case("spec method raises", 2, r"^pipeline: ar_diffusion_kv_cache_spec\(\) raised "
         r"RuntimeError: geometry unknown before load",
         config=entry("spec_pipelines.py:SpecRaisesPipeline")),
    Case("spec method returns no spec", 2, r"^pipeline: ar_diffusion_kv_cache_spec\(\) "
         r"returned a dict; it must return an ARDiffusionKVCacheSpec",
         config=entry("spec_pipelines.py:WrongSpecTypePipeline")),
    Case("rollout longer than max_model_len", 2, r"^rollout\.frames: 20 frames need 10 blocks "
         r"in a row, frame positions up to 20, but the pipeline's max_model_len is 8; lower "
         r"rollout\.frames to 8", args=("--frames", "20"), config=args_of(max_model_len=8)),
    Case("interleaved prompts do not fit", 2, r"^rollout\.interleave: 3 prompts need 3 resident "
         r"sessions but the pipeline's session_capacity of 2 \(pipeline\.args\.session_capacity "
         r"where the pipeline takes it\) keeps 2; raise it",
         config=rollout(prompts=["a", "b", "c"], interleave=True)),
    Case("the pipeline's load raises", 1, r"^pipeline: load\('cpu', float32\) raised "
         r"InjectedFault: checkpoint /models/missing\.safetensors not found",
         config=args_of(fault="load")),
    # -- --set --------------------------------------------------------------------------------
    Case("`--set` without `=`", 2, r"^--set: 'novalue' is not KEY=VALUE; write e\.g\. --set "
         r"runtime\.kv\.window_frames=12", args=("--set", "novalue")),
    Case("`--set` into a value", 2, r"^--set rollout\.frames\.x: rollout\.frames is a value, not "
         r"a section; it cannot hold 'x'", args=("--set", "rollout.frames.x=3")),
    Case("`--set` unknown key", 2, r"^runtime\.kv\.windw_frames: unknown key; did you mean "
         r"'window_frames'\?", args=("--set", "runtime.kv.windw_frames=3")),
    Case("`--set` bad value", 2, r"^rollout\.seed: expected an integer, got 'abc' \(str\)",
         args=("--set", "rollout.seed=abc")),
    # -- the output ---------------------------------------------------------------------------
    Case("output folder missing", 2, r"^output\.path: 'missing/out\.mp4' is in a folder that "
         r"does not exist \('missing'\); create it first", args=("-o", "missing/out.mp4")),
    Case("output folder not writable", 2, r"^output\.path: 'ro/out\.mp4' is in a folder that is "
         r"not writable \('ro'\); fix its permissions", args=("-o", "ro/out.mp4"),
         needs=READ_ONLY),
    Case("output PNG folder is a file", 2, r"^output\.path: 'frames' is an existing file, and a "
         r"path without a suffix means a folder of PNG frames; add a suffix",
         args=("-o", "frames"), files=(("frames", "not a folder\n"),)),
    Case("unsupported extension", 2, r"^output\.path: 'out\.avi' has an unsupported suffix "
         r"'\.avi'; use one of \.mp4, \.mkv", args=("-o", "out.avi")),
    Case("codec not of the format", 2, r"^output\.codec: 'libx265' is not a codec for \.mp4 "
         r"files; use one of libx264", args=("--set", "output.codec=libx265")),
    Case("crf out of range", 2, r"^output\.crf: 60 is out of range for libx264 \(0\.\.51\); try "
         r"23", args=("--set", "output.crf=60")),
    Case("unknown x264 preset", 2, r"^output\.preset: 'turbo' is not an x264 preset; use one of "
         r"ultrafast", args=("--set", "output.preset=turbo")),
    Case("`--json` folder missing", 2, r"^--json: 'missing/stats\.json' is in a folder that does "
         r"not exist \('missing'\); create it first", args=("--json", "missing/stats.json")),
    Case("`--json` not writable", 2, r"^--json: 'ro/stats\.json' is not writable; fix the "
         r"permissions of the file or of its folder 'ro', or pick another path",
         args=("--json", "ro/stats.json"), needs=READ_ONLY),
    Case("`--json` names a folder", 2, r"^--json: 'stats' is a folder; give a file name like "
         r"'stats/stats\.json'", args=("--json", "stats"), files=(("stats/.keep", ""),)),
    Case("`--report` not a picture", 2, r"^--report: 'run\.jpg' has no picture suffix; end it "
         r"in \.png, \.svg, \.html", args=("--report", "run.jpg")),
    Case("`play` with a pipeline without actions", 2, r"^pipeline: 'fault_pipelines\.py:"
         r"FaultPipeline' declares no actions \(no action_names\); ardiff play needs an "
         r"action-conditioned pipeline, such as the default one", command="play"),
    Case("`play` without a terminal", 2, r"^ardiff play: needs a terminal \(stdin and stderr "
         r"are not both TTYs\); to run actions without one, use ardiff rollout --actions "
         r"FILE", config=entry("bouncing"), command="play"),
    Case("`play.keys` uses q", 2, r"^play\.keys: 'q' is reserved: it ends ardiff play; "
         r"choose another key", config={"play": {"keys": {"left": ["q"]}}}, command="play"),
    # -- device, dtype, memory ----------------------------------------------------------------
    Case("unknown device", 2, r"^runtime\.device: 'tpu' is not a device; use cpu, cuda, cuda:N "
         r"or auto", args=("--device", "tpu")),
    Case("unknown dtype", 2, r"^runtime\.dtype: 'fp8' \(str\) is not allowed; use one of "
         r"'auto', 'float32', 'bfloat16', 'float16'", args=("--dtype", "fp8")),
    Case("CUDA requested where none exists", 2, r"^runtime\.device: 'cuda' was requested but "
         r"CUDA is not available on this machine; use --device cpu", args=("--device", "cuda"),
         needs=NO_CUDA),
    Case("budget too small for one session", 3, r"^runtime\.memory_budget: 100B cannot hold one "
         r"session \(needs 1\.2KiB: 768B per session \+ 512B shared, short by 1\.2KiB\); "
         r"raise the budget to at least 1\.2KiB",
         args=("--budget", "100"), subprocess=True),
    Case("budget too small (`inspect-spec`)", 3, r"^runtime\.memory_budget: 100B cannot hold "
         r"one session", args=("--budget", "100"), command="inspect-spec"),
    Case("budget too small (`warmup`)", 3, r"^runtime\.memory_budget: 100B cannot hold one "
         r"session", args=("--budget", "100"), command="warmup"),
    # -- #24: weights in the plan, the text encoder where it fits ------------------------------
    Case("`inspect-spec --device-memory` not bytes", 2, r"^--device-memory: '0\.8' is not a size "
         r"in bytes; give the device's memory like 24GiB, 80GB or 25769803776$",
         args=("--device-memory", "0.8"), command="inspect-spec"),
    Case("`text_encoder_device` not a device", 2, r"^pipeline: constructing 'ardiff\.pipelines\."
         r"causal_wan:CausalWan' with args \{.*'text_encoder_device': 'gpu'\} raised ConfigError: "
         r"pipeline\.args\.text_encoder_device: 'gpu' is not allowed; use auto, cpu, cuda or "
         r"cuda:N$",
         config=entry(CAUSAL_WAN, **TINY_WAN, text_encoder_device="gpu"), files=WAN_CONFIGS,
         command="inspect-spec"),
    # -- prompt and action files --------------------------------------------------------------
    Case("prompts file missing", 2, r"^rollout\.prompts: cannot read 'nope\.txt' "
         r"\(FileNotFoundError: .*\); give a UTF-8 text file with one prompt per line",
         args=("--prompts", "nope.txt")),
    Case("prompts file empty", 2, r"^rollout\.prompts: 'prompts\.txt' has no prompts; write one "
         r"per line", args=("--prompts", "prompts.txt"),
         files=(("prompts.txt", "# nothing yet\n\n"),)),
    Case("prompts file not UTF-8", 2, r"^rollout\.prompts: cannot read 'prompts\.txt' "
         r"\(UnicodeDecodeError: .*\); give a UTF-8 text file", args=("--prompts", "prompts.txt"),
         files=(("prompts.txt", b"\xff\xfe a cat\n"),)),
    Case("actions file missing", 2, r"^rollout\.actions: cannot read 'nope\.yaml' "
         r"\(FileNotFoundError\); give a UTF-8 YAML file with a list of actions",
         args=("--actions", "nope.yaml")),
    Case("actions file not UTF-8", 2, r"^rollout\.actions: cannot read 'actions\.yaml' "
         r"\(UnicodeDecodeError\); give a UTF-8 YAML file", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", b"- \xff\xfe\n"),)),
    Case("actions file YAML syntax error", 2, r"^rollout\.actions \(actions\.yaml\): YAML syntax "
         r"error at line 2, column 1; fix the file", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "actions: [left\n"),)),
    Case("actions file not a list", 2, r"^rollout\.actions \(actions\.yaml\): expected a "
         r"non-empty list of actions, got 'left'", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "left\n"),)),
    Case("actions file entry not an action", 2, r"^rollout\.actions \(actions\.yaml\)\[1\]: 3 is "
         r"not an action; use a name like left", args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "- left\n- 3\n"),)),
    # -- values out of bounds, text, YAML limits (docs/configs.md#bounds) ----------------------
    Case("`output.fps` not a finite number", 2, r"^output\.fps: nan is invalid; it must be a "
         r"finite number; try 16", config={"output": {"fps": float("nan")}}),
    Case("`--fps` below what every format stores", 2, r"^output\.fps: 0\.001 is invalid; it "
         r"must be from 0\.01 to 1000 frames per second \(what every output format stores\); "
         r"try 16", args=("--fps", "0.001")),
    Case("guidance scale not finite", 2, r"^rollout\.guidance_scale: inf is invalid; it must be "
         r"a finite number", args=("--set", "rollout.guidance_scale=.inf")),
    Case("`--seed` beyond 32 bits", 2, r"^rollout\.seed: 4294967296 is invalid; it must be <= "
         r"4294967295", args=("--seed", "4294967296")),
    Case("`--frames` beyond the longest rollout", 2, r"^rollout\.frames: 1000001 is invalid; it "
         r"must be <= 1000000", args=("--frames", "1000001")),
    Case("too many denoising steps", 2, r"^rollout\.num_steps: 1001 is invalid; it must be <= "
         r"1000", config=rollout(num_steps=1001)),
    Case("crf no codec takes", 2, r"^output\.crf: 99 is invalid; it must be <= 63",
         args=("--set", "output.crf=99")),
    Case("`output.scale` beyond the largest", 2, r"^output\.scale: 33 is invalid; it must be "
         r"<= 32", args=("--set", "output.scale=33")),
    Case("too many sessions", 2, r"^runtime\.max_sessions: 100000 is invalid; it must be <= "
         r"65536", config={"runtime": {"max_sessions": 100000}}),
    Case("`runtime.compile` on a pipeline that cannot compile", 2, r"^runtime\.compile: true "
         r"needs a pipeline with a compile_layers\(compiler\) method, and "
         r"fault_pipelines\.py:FaultPipeline has none; set runtime\.compile: false$",
         args=("--set", "runtime.compile=true")),
    Case("budget beyond any device", 2, r"^runtime\.memory_budget: '2000TiB' is more than "
         r"1024TiB, the largest budget ardiff plans; give what the device has, like 80GiB",
         args=("--budget", "2000TiB")),
    Case("budget above the device's free memory", 3, r"^runtime\.memory_budget: 1024TiB is more "
         r"than the [0-9.]+[KMGT]iB free on cpu; lower runtime\.memory_budget to at most "
         r"[0-9.]+[KMGT]iB or give a fraction of free memory like 0\.8$",
         args=("--budget", "1024TiB"), exact=False),
    Case("prompt not valid Unicode", 2, r"^rollout\.prompt: 'a \\udcff cat' is not valid "
         r"Unicode \(a lone surrogate '\\udcff' at character 2: bytes that are not UTF-8\?\); "
         r"write it in UTF-8", args=("--prompt", "a \udcff cat")),
    Case("NUL character in a path", 2, r"^output\.path: 'a\\x00b\.mp4' holds a NUL character "
         r"at character 1; remove it", config={"output": {"path": "a\0b.mp4"}}),
    Case("a 5000-character key", 2, r"^runtime\.kv\.w{38}\.\.\.w{19}: unknown key; known keys: "
         r"backend", args=("--set", "runtime.kv." + "w" * 5000 + "=1")),
    Case("duplicate key", 2, r"^run\.yaml: key 'rollout\.frames' appears twice, at line 4 and "
         r"line 5; keep one of them", config="pipeline:\n  entry: fault_pipelines.py:Fault"
         "Pipeline\nrollout:\n  frames: 4\n  frames: 8\n"),
    Case("YAML alias bomb", 2, r"^run\.yaml: its aliases expand to more than 100,000 values; "
         r"use fewer aliases", config="pipeline:\n  entry: fault_pipelines.py:FaultPipeline\n"
         "  args:\n    l0: &l0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
             f"    l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))),
    Case("recursive YAML alias", 2, r"^run\.yaml: the value at line 3 contains itself through "
         r"an alias; a config cannot be recursive", config="pipeline:\n  entry: fault_pipelines"
         ".py:FaultPipeline\n  args: &args {self: *args}\n"),
    Case("control character in YAML", 2, r"^run\.yaml: YAML syntax error at line 4, column 13: "
         r"character #x0007 is not allowed in YAML \(a control character\); fix the YAML there",
         config="pipeline:\n  entry: fault_pipelines.py:FaultPipeline\nrollout:\n"
         "  prompt: \"a\x07\"\n"),
    Case("actions file with a duplicate key", 2, r"^rollout\.actions \(actions\.yaml\): key "
         r"'actions' appears twice, at line 1 and line 2; keep one of them",
         args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "actions: [left]\nactions: [right]\n"),)),
    # -- paths that collide, paths no file can have -------------------------------------------
    Case("output is the config file", 2, r"^output\.path: 'run\.yaml' is the same file as "
         r"config 'run\.yaml'; the run would overwrite its input; pick another name",
         args=("-o", "run.yaml")),
    Case("`--json` is the config file, spelled another way", 2, r"^--json: '\./run\.yaml' is "
         r"the same file as config 'run\.yaml' \(both are '.*run\.yaml'\); the run would "
         r"overwrite its input", args=("--json", "./run.yaml")),
    Case("`--json` is the output video", 2, r"^--json: 'out\.mp4' is the same file as "
         r"output\.path 'out\.mp4'; the run would write it twice", args=("--json", "out.mp4")),
    Case("`--json` is the prompts file", 2, r"^--json: 'prompts\.txt' is the same file as "
         r"rollout\.prompts '.*prompts\.txt'", args=("--prompts", "prompts.txt", "--json",
                                                    "prompts.txt"),
         files=(("prompts.txt", "a red ball\n"),)),
    Case("two prompts' outputs are one file", 2, r"^output\.path: two streams would write one "
         r"file, 'x0/\.\./out\.mp4' and 'x1/\.\./out\.mp4' \(both are '.*out\.mp4'\); put "
         r"\{index\} in the file name",
         args=("--set", "rollout.prompts=[a, b]", "-o", "x{index}/../out.mp4")),
    Case("output path empty", 2, r"^output\.path: '' is empty; give a file name like "
         r"'out\.mp4'", args=("-o", "")),
    Case("output path blank", 2, r"^output\.path: ' ' is blank; give a file name like "
         r"'out\.mp4'", args=("-o", " ")),
    Case("`--json` empty", 2, r"^--json: '' is empty; give a file name like 'stats\.json'",
         args=("--json", "")),
    Case("`--json` ends in a separator", 2, r"^--json: 'stats/' names a folder, and a file is "
         r"needed here; give a file name like 'stats/stats\.json'", args=("--json", "stats/")),
    Case("prompts path names a folder", 2, r"^rollout\.prompts: 'lists/\.\.' names a folder, "
         r"and a file is needed here", config=rollout(prompts="lists/..")),
    Case("actions path blank", 2, r"^rollout\.actions: ' ' is blank; give a file name like "
         r"'actions\.yaml'", config=rollout(actions=" ")),
    # -- #25: every path a command writes, against what it reads and each other ------------
    Case("`--json` is the pipeline's entry file", 2, r"^--json: 'fault_pipelines\.py' is the "
         r"same file as pipeline\.entry '.*fault_pipelines\.py' \(both are .*\); the run "
         r"would overwrite its input; pick another name, like 'stats\.json'$",
         args=("--json", "fault_pipelines.py")),
    Case("`--report` is the `--json` file", 2, r"^--report: 'run\.svg' is the same file as "
         r"--json 'run\.svg'; the run would write it twice, and one would be lost; pick another "
         r"name, like 'run\.png'$", args=("--json", "run.svg", "--report", "run.svg"),
         extra="plot"),
    Case("`bench --plot` is the `--json` file", 2, r"^--plot: 'b\.svg' is the same file as "
         r"--json 'b\.svg'; the run would write it twice", command="bench",
         args=("--json", "b.svg", "--plot", "b.svg"), extra="plot"),
    Case("`play --actions-out` is the config file", 2, r"^--actions-out: 'run\.yaml' is the "
         r"same file as config 'run\.yaml'; the run would overwrite its input; pick another "
         r"name, like 'play\.actions\.yaml'$", config=entry("bouncing"), command="play",
         args=("--actions-out", "run.yaml")),
    Case("`--json` is a file the pipeline loads (a LoRA)", 2, r"^--json: 'lora\.pt' is the "
         r"same file as pipeline\.args\.lora_ckpt '.*lora\.pt'( \(both are .*\))?; the run "
         r"would overwrite its input; pick another name, like 'stats\.json'$",
         config=entry(CAUSAL_WAN, **TINY_WAN, lora_ckpt="lora.pt"), files=WAN_CONFIGS,
         args=("--json", "lora.pt")),
    Case("an output inside the pipeline's model folder", 2, r"^--json: 'wan/vae/config\.json' "
         r"is inside pipeline\.args\.model_dir 'wan', a folder the run reads; the run would "
         r"overwrite its input; pick another name, like 'stats\.json'$",
         config=entry(CAUSAL_WAN, **TINY_WAN), files=WAN_CONFIGS,
         args=("--json", "wan/vae/config.json")),
    Case("`-o -`", 2, r"^output\.path: '-' is not stdout here \(only --json - is\): it would "
         r"name a folder of PNG frames called '-'; give a file name like 'out\.mp4', or '\./-' "
         r"to mean that folder$", args=("-o", "-")),
    Case("`ar_diffusion_input_paths` not a mapping", 2, r"^pipeline: ar_diffusion_input_paths"
         r"\(\) returned a list; it must return a mapping of names to paths, like "
         r"\{'pipeline\.args\.model_dir': 'models/wan'\}$",
         config=entry("lists_inputs.py:ListsInputs"), files=(("lists_inputs.py", LISTS_INPUTS),),
         args=("--json", "stats.json")),
    # -- #25: inputs checked where they enter; bench's lengths checked like rollout's ------------
    Case("prompts file with a NUL character", 2, r"^rollout\.prompts \(prompts\.txt\) line 2: "
         r"'a red\\x00ball' holds a NUL character at character 5; remove it$",
         args=("--prompts", "prompts.txt"), files=(("prompts.txt", "a cat\na red\0ball\n"),)),
    Case("actions file with a NUL character", 2, r"^rollout\.actions \(actions\.yaml\)\[0\]: "
         r"'le\\x00ft' holds a NUL character at character 2; remove it$",
         args=("--actions", "actions.yaml"), files=(("actions.yaml", '- "le\\0ft"\n'),)),
    Case("actions file with a lone surrogate", 2, r"^rollout\.actions \(actions\.yaml\)\[0\]: "
         r"'le\\udcffft' is not valid Unicode \(a lone surrogate '\\udcff' at character 2: "
         r"bytes that are not UTF-8\?\); write it in UTF-8$",
         args=("--actions", "actions.yaml"), files=(("actions.yaml", '- "le\\udcffft"\n'),)),
    Case("an action the pipeline does not declare", 2, r"^rollout\.actions \(actions\.yaml\)"
         r"\[1\]: 'jump' is not an action of this pipeline; use one of none, left, right, up, "
         r"down$", config=entry("bouncing"), args=("--actions", "actions.yaml"),
         files=(("actions.yaml", "- left\n- jump\n"),)),
    Case("more actions than the block has frames", 2, r"^rollout\.actions\[0\]: \['left', "
         r"'up'\] is 2 actions for a block of 1 frame\(s\); give one action for the whole block "
         r"or one per frame$", config=entry("bouncing"),
         args=("--set", "rollout.actions=[[left, up]]")),
    Case("a set (`!!set`) in the config", 2, r"^run\.yaml: the set \(!!set\) at line 4 has no "
         r"order; write a list such as \[a, b\] instead$", config="pipeline:\n  entry: "
         "fault_pipelines.py:FaultPipeline\nrollout:\n  prompts: !!set {a red ball, a cat}\n"),
    Case("a relative path in `pipeline.args` not found", 2, r"^pipeline: constructing "
         r"'reads\.py:Reads' with args \{'ckpt': 'weights/model\.pt'\} raised "
         r"FileNotFoundError: \[Errno 2\] No such file or directory: 'weights/model\.pt' "
         r"\(relative paths in pipeline\.args are relative to the working directory '.*'\)$",
         config=entry("reads.py:Reads", ckpt="weights/model.pt"),
         files=(("reads.py", "class Reads:\n    def __init__(self, ckpt):\n"
                             "        open(ckpt, 'rb')\n"),)),
    Case("a relative path the pipeline's `load` cannot open", 1, r"^pipeline: load\('cpu', "
         r"float32\) raised FileNotFoundError: \[Errno 2\] No such file or directory: "
         r"'weights/model\.pt' \(relative paths in pipeline\.args are relative to the working "
         r"directory '.*'\)$", config=entry("loads.py:Loads", ckpt="weights/model.pt"),
         files=(("loads.py", "from fault_pipelines import FaultPipeline\n\n\n"
                             "class Loads(FaultPipeline):\n"
                             "    def __init__(self, ckpt):\n"
                             "        super().__init__()\n"
                             "        self.ckpt = ckpt\n\n"
                             "    def load(self, device, dtype):\n"
                             "        open(self.ckpt, 'rb')\n"),)),
    Case("`bench --blocks 0`", 2, r"^--blocks: 0 is invalid; it must be > 0$", command="bench",
         args=("--blocks", "0")),
    Case("`bench --repeats` beyond the most", 2, r"^--repeats: 1001 is invalid; it must be <= "
         r"1000$", command="bench", args=("--repeats", "1001")),
    Case("`bench --sweep-frames` beyond the longest rollout", 2, r"^--sweep-frames: 1000001 is "
         r"invalid; it must be <= 1000000$", command="bench",
         args=("--sweep-frames", "100,1000001")),
    Case("`bench --blocks` past the pipeline's max_model_len", 2, r"^--blocks: 17 timed blocks "
         r"after the 4 that fill the window reach frame position 42, past the pipeline's "
         r"max_model_len of 40; use --blocks 16 at most$", command="bench",
         config=args_of(max_model_len=40), args=("--blocks", "17", "--no-encode")),
    Case("`bench` encode runs past the pipeline's max_model_len", 2, r"^--blocks: the encode "
         r"runs make 32 blocks after the 4 that fill the window, reaching frame position 72, "
         r"past the pipeline's max_model_len of 40; add --no-encode$", command="bench",
         config=args_of(max_model_len=40), args=("--blocks", "2")),
    Case("`bench --sweep-frames` past the pipeline's max_model_len", 2, r"^--sweep-frames: 41 "
         r"frames reach frame position 42, past the pipeline's max_model_len of 40; use at most "
         r"40$", command="bench", config=args_of(max_model_len=40),
         args=("--sweep-frames", "41", "--no-encode")),
    Case("`bench --workers` beyond the most", 2, r"^runtime\.parallel\.workers: 2000 is "
         r"invalid; it must be <= 1024$", command="bench", args=("--workers", "2000")),
    Case("`bench --workers` more than prompts", 2, r"^runtime\.parallel\.workers: 2 replicas "
         r"for 1 prompt\(s\) would leave 1 idle; use at most 1 \(or give more prompts\)$",
         command="bench", args=("--workers", "2")),
    Case("`bench --plot` of a rollout past the pipeline's max_model_len", 2, r"^rollout\.frames: "
         r"60 frames need 30 blocks in a row, frame positions up to 60, but the pipeline's "
         r"max_model_len is 40; lower rollout\.frames to 40", command="bench",
         config={**args_of(max_model_len=40), **rollout(frames=60)},
         args=("--no-encode", "--plot", "run.png"), extra="plot"),
    # -- #25, red team: a PNG folder's frames are files it replaces ---------------------------
    Case("a PNG folder that holds an input named like a frame", 2, r"^output\.path: 'frames' is "
         r"a folder of PNG frames that holds rollout\.prompts 'frame_000000\.png'; the run "
         r"replaces every frame_\*\.png in it, so it would overwrite its input; move the input "
         r"or pick another folder$", files=(("frames/frame_000000.png", "a red ball\n"),),
         args=("-o", "frames/", "--prompts", "frames/frame_000000.png")),
    # -- #24: a prompt schedule in latent frames (latent_frame:) ------------------------------
    Case("a schedule entry with both frame and latent_frame", 2, r"^rollout\.prompt\[1\]: "
         r"frame 9 and latent_frame 3 both given; give one of them$", config=rollout(prompt=[
             {"frame": 0, "prompt": "a"}, {"frame": 9, "latent_frame": 3, "prompt": "b"}])),
    Case("a schedule entry with neither frame nor latent_frame", 2, r"^rollout\.prompt\[1\]: "
         r"a schedule entry needs frame \(a video frame\) or latent_frame; add one$",
         config=rollout(prompt=[{"frame": 0, "prompt": "a"}, {"prompt": "b"}])),
    Case("latent_frame for a pipeline without latent frames", 2, r"^rollout\.prompt\[1\]\."
         r"latent_frame: this pipeline declares no latent frames \(video_frames_per_latent_"
         r"frame\); give frame: \(a video frame\) instead$",
         config={**entry("ardiff.pipelines.tiny_dit:TinyCausalDiT"), **rollout(prompt=[
             {"frame": 0, "prompt": "a"}, {"latent_frame": 3, "prompt": "b"}])}),
    Case("latent_frame after an on_switch: reset", 2, r"^rollout\.prompt\[2\]\.latent_frame: "
         r"6 comes after an on_switch: reset, where the latent frames start over; give frame: "
         r"\(a video frame\) instead$", config=rollout(prompt=[
             {"frame": 0, "prompt": "a"}, {"frame": 2, "prompt": "b", "on_switch": "reset"},
             {"latent_frame": 6, "prompt": "c"}])),
    Case("a schedule whose latent_frame comes before an earlier frame", 2, r"^rollout\.prompt: "
         r"the schedule's video frames \[0, 5, 4\] \(latent_frame entries converted\) must "
         r"increase strictly; reorder the entries$", config=rollout(prompt=[
             {"frame": 0, "prompt": "a"}, {"frame": 5, "prompt": "b"},
             {"latent_frame": 4, "prompt": "c"}])),
    # -- #26: several prompts per forward (rollout.batch, --batch) -----------------------------
    Case("`--batch 0`", 2, r"^rollout\.batch: 0 is invalid; it must be from 1 to 65536 "
         r"\(sessions in one forward\), or auto$", args=("--batch", "0")),
    Case("`--batch` not a number", 2, r"^rollout\.batch: 'four' is not a batch size; give an "
         r"integer >= 1, or auto to let ardiff choose$", args=("--batch", "four")),
    # -- #24: a causal-Wan model folder in neither Wan2.1 layout ---------------------------------
    Case("a causal-Wan model folder in neither layout", 2, r"^pipeline: constructing 'ardiff\."
         r"pipelines\.causal_wan:CausalWan' with args \{.*\} raised PipelineLoadError: "
         r"pipeline\.args\.model_dir: 'models' is in neither Wan2\.1 folder layout: the Diffusers one \(Wan-AI/Wan2\.1-T2V-1\.3B-"
         r"Diffusers\) lacks transformer/config\.json, text_encoder/, tokenizer/; Wan's original "
         r"one \(Wan-AI/Wan2\.1-T2V-1\.3B\) lacks config\.json, diffusion_pytorch_model\."
         r"safetensors, Wan2\.1_VAE\.pth, models_t5_umt5-xxl-enc-bf16\.pth, google/umt5-xxl/; "
         r"download one: hf download Wan-AI/Wan2\.1-T2V-1\.3B-Diffusers --local-dir models \(or "
         r"hf download Wan-AI/Wan2\.1-T2V-1\.3B --local-dir models\)$",
         config=entry(CAUSAL_WAN, **dict(TINY_WAN, model_dir="models")),
         files=(("models/vae/config.json", json.dumps(TINY_VAE)),)),
    # -- #26: bench --batch, sizes checked like the bench's other lists ------------------------
    Case("`bench --batch 0`", 2, r"^--batch: 0 is invalid; it must be > 0$", command="bench",
         args=("--batch", "1,0")),
    Case("`bench --batch` beyond the most resident sessions", 2, r"^--batch: 65537 is invalid; "
         r"it must be <= 65536$", command="bench", args=("--batch", "65537")),
    Case("`bench --batch` with a size twice", 2, r"^--batch: 2 is given twice; give each batch "
         r"size once, like 1,2,4,8$", command="bench", args=("--batch", "1,2,2")),
    Case("`bench --batch` beside `--workers`", 2, r"^--batch: cannot be combined with "
         r"--workers; it measures batch sizes alone: run --workers as another bench$",
         command="bench", args=("--batch", "1,2", "--workers", "2")),
    Case("`bench --batch` past the pipeline's session_capacity", 2, r"^--batch: 4 sessions at "
         r"once, but the pipeline's spec holds at most 2 resident \(its session_capacity\); use "
         r"batch sizes up to 2, or raise it where the pipeline takes it \(e\.g\. --set "
         r"pipeline\.args\.session_capacity=4\)$", command="bench", args=("--batch", "1,4")),
    # -- #27: ardiff serve (refused before the port is bound or the model loads) ----------------
    Case("`serve` with several prompts (rollout.prompts)", 2, r"^rollout\.prompts: ardiff serve "
         r"runs one prompt per session \(a request's body gives it\); remove rollout\.prompts$",
         command="serve", args=("--port", "0"), config={"rollout": {"prompts": ["a", "b"]}},
         extra="serve"),
    Case("`serve.queue_frames: 0`", 2, r"^serve\.queue_frames: 0 is invalid; it must be > 0$",
         command="serve", args=("--port", "0"), config={"serve": {"queue_frames": 0}}),
    Case("`serve --token ''`", 2, r"^--token: empty; give a secret, or no token at all$",
         command="serve", args=("--port", "0", "--token", "")),
    # -- #36: who may call (before the model loads) ------------------------------------------------
    Case("`serve --token T --token-file F`", 2, r"^--token-file: given with --token; give the "
         r"token one way$", command="serve", args=("--port", "0", "--token", "a",
                                                   "--token-file", "f")),
    Case("`serve --host 0.0.0.0` without a token", 2, r"^--host: 0\.0\.0\.0 is reachable from "
         r"other machines and there is no token; give --token-file FILE \(or "
         r"\$ARDIFF_SERVE_TOKEN\), or --no-token to let anyone who can reach it start sessions$",
         command="serve", args=("--port", "0", "--host", "0.0.0.0")),
    # -- #27: ardiff serve --workers (refused before any worker starts) ---------------------------
    Case("`serve --workers 2` with CFG-parallel ranks", 2, r"^runtime\.parallel: ardiff serve "
         r"runs data-parallel workers only \(--workers N, one per device\); set "
         r"runtime\.parallel\.cfg: 1 and launcher: spawn$", command="serve",
         args=("--port", "0", "--workers", "2"), config={"runtime": {"parallel": {"cfg": 2}}},
         extra="serve"),
]
