"""`ardiff inspect-spec`, in-process: exit codes through the script's `main()` run from an
empty folder (`cli`), output and flags through Typer's runner (`invoke`). The installed
command itself is tested in test_main.py and test_catalogue.py.

The fixture pipeline's TINY_SPEC (2 layers, 2 heads of 4, 6 tokens per frame,
blocks of 2, window 5, sink 1, capacity 4) in float32 plans:

    page_bytes = 2 * 6 * 2 * 4 * 4 * 2 = 768;  history 1 + (5 - 2) = 4 pages per session;
    in flight 2 pages;  bytes_per_session = 4 * 768 = 3072;  fixed_bytes = 2 * 768 = 1536
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ardiff_cli.main import app

REPO = Path(__file__).resolve().parents[2]

EFFECTIVE_KEYS = {"window_frames", "sink_frames", "page_tokens", "pages_per_frame", "dtype",
                  "device"}
MEMORY_KEYS = {"page_bytes", "history_frames_per_branch", "history_pages_per_session",
               "inflight_pages", "register_pages", "cross_attention_bytes_per_session",
               "model_owned_bytes_per_session", "bytes_per_session", "fixed_bytes",
               "budget_bytes", "session_capacity", "total_pages", "total_bytes"}


@pytest.fixture
def cli(tmp_path, monkeypatch, ardiff_main):
    """`cli(*args) -> Result`: the `ardiff` script's `main()`, run from an empty folder."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return ardiff_main


@pytest.fixture
def invoke(tmp_path, monkeypatch):
    """`invoke(*args) -> Result` (exit_code, stdout, stderr): the app in this process."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str):
        return CliRunner().invoke(app, [str(a) for a in args])

    return run


@pytest.fixture
def tiny_config(write_config, pipelines_file):
    """`tiny_config(attr="GoodPipeline", **args) -> Path`: a fixture pipeline, a 1MiB budget."""

    def make(attr: str = "GoodPipeline", **args) -> Path:
        config = {"pipeline": {"entry": f"{pipelines_file}:{attr}", "args": args},
                  "runtime": {"memory_budget": "1MiB"}}
        return write_config(json.dumps(config))   # JSON is YAML

    return make


def as_json(result) -> dict:
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def assert_one_line_error(result, code: int, message: str):
    assert result.exit_code == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]


# ---- output --------------------------------------------------------------------------------

def test_tables_render(cli, tiny_config):
    result = cli("inspect-spec", tiny_config(cross_tokens=8))
    assert result.exit_code == 0, result.stderr
    for text in ("Geometry", "Branches", "Cross-attention", "Window", "sliding",
                 "Memory plan (float32", "6 tokens per", "sessions that fit",
                 "page size", "768B"):
        assert text in result.stdout
    assert re.search(r"frames a block attends to\D*6\b", result.stdout)  # sink 1 + window 5
    assert re.search(r"frames kept per branch\D*4\b", result.stdout)     # 1 + (5 - 2)
    assert re.search(r"sessions that fit\D*4\b", result.stdout)
    assert result.stderr == ""


def test_no_cross_attention_table_without_caches(invoke, tiny_config):
    result = invoke("inspect-spec", tiny_config())
    assert result.exit_code == 0 and "Cross-attention" not in result.stdout


def test_json_has_exactly_the_stable_keys(cli, tiny_config):
    data = as_json(cli("inspect-spec", tiny_config(), "--json"))
    assert set(data) == {"spec", "effective", "memory", "weights_declared"}  # none declared
    assert data["weights_declared"] is False
    assert set(data["effective"]) == EFFECTIVE_KEYS
    assert set(data["memory"]) == MEMORY_KEYS
    assert data["spec"]["kv_branches"] == [{"name": "main", "local_index": 0}]
    assert data["effective"] == {"window_frames": 5, "sink_frames": 1, "page_tokens": 6,
                                 "pages_per_frame": 1, "dtype": "float32", "device": "cpu"}
    assert data["memory"] == {
        "page_bytes": 768, "history_frames_per_branch": 4, "history_pages_per_session": 4,
        "inflight_pages": 2, "register_pages": 0, "cross_attention_bytes_per_session": 0,
        "model_owned_bytes_per_session": 0, "bytes_per_session": 3072, "fixed_bytes": 1536,
        "budget_bytes": 2**20, "session_capacity": 4,          # capped by the spec
        "total_pages": 18, "total_bytes": 13824}               # 4 * 4 + 2 pages of 768


def test_budget_flag(invoke, tiny_config):
    memory = as_json(invoke("inspect-spec", tiny_config(), "--json", "--budget", "4608"))["memory"]
    assert (memory["budget_bytes"], memory["session_capacity"]) == (4608, 1)   # 1536 + 3072
    memory = as_json(invoke("inspect-spec", tiny_config(), "--json", "--budget", "10KiB"))["memory"]
    assert (memory["budget_bytes"], memory["session_capacity"]) == (10240, 2)  # (10240-1536)//3072


def test_fraction_budget_measures_free_memory(invoke, tiny_config):
    memory = as_json(invoke("inspect-spec", tiny_config(), "--json", "--budget", "0.5"))["memory"]
    assert memory["budget_bytes"] > 0 and memory["session_capacity"] == 4


def test_dtype_flag(invoke, tiny_config):
    data = as_json(invoke("inspect-spec", tiny_config(), "--json", "--dtype", "bfloat16"))
    assert data["effective"]["dtype"] == "bfloat16"
    assert data["memory"]["page_bytes"] == 384               # 2 * 6 * 2 * 4 * 2 * 2


def test_page_tokens_flag(invoke, tiny_config):
    data = as_json(invoke("inspect-spec", tiny_config(), "--json", "--page-tokens", "4"))
    assert data["effective"]["page_tokens"] == 4
    assert data["effective"]["pages_per_frame"] == 2         # ceil(6 / 4)
    assert data["memory"]["page_bytes"] == 512               # 2 * 4 * 2 * 4 * 4 * 2
    assert data["memory"]["history_pages_per_session"] == 8  # 4 frames * 2 pages


def test_set_overrides_runtime_and_pipeline_args(invoke, tiny_config):
    data = as_json(invoke("inspect-spec", tiny_config(), "--json",
                          "--set", "runtime.kv.window_frames=3",
                          "--set", "runtime.kv.sink_frames=0",
                          "--set", "pipeline.args.head_size=8"))
    assert (data["spec"]["window_frames"], data["spec"]["sink_frames"]) == (5, 1)  # declared
    assert (data["effective"]["window_frames"], data["effective"]["sink_frames"]) == (3, 0)
    assert data["spec"]["head_size"] == 8
    assert data["memory"]["history_frames_per_branch"] == 1  # 0 + (3 - 2)
    assert data["memory"]["page_bytes"] == 1536              # 2 * 6 * 2 * 8 * 4 * 2


def test_flags_win_over_set(invoke, tiny_config):
    data = as_json(invoke("inspect-spec", tiny_config(), "--json",
                          "--set", "runtime.dtype=float16", "--dtype", "bfloat16"))
    assert data["effective"]["dtype"] == "bfloat16"


def test_relative_config_path_and_entry(cli, tmp_path, pipelines_file, write_config):
    (tmp_path / "cwd" / "plugins").mkdir()
    shutil.copy(pipelines_file, tmp_path / "cwd" / "plugins" / "models.py")
    write_config("pipeline: {entry: '../plugins/models.py:GoodPipeline'}\n"
                 "runtime: {memory_budget: 1MiB}\n", name="cwd/configs/run.yaml")
    assert as_json(cli("inspect-spec", "configs/run.yaml", "--json"))["memory"]["page_bytes"] == 768


def test_wan_example(cli):
    data = as_json(cli("inspect-spec", REPO / "examples" / "wan_spec_only.yaml", "--json"))
    assert data["effective"] == {"window_frames": 21, "sink_frames": 0, "page_tokens": 1560,
                                 "pages_per_frame": 1, "dtype": "bfloat16", "device": "cuda"}
    memory = data["memory"]
    assert memory["page_bytes"] == 287_539_200               # 2 * 1560 * 12 * 128 * 2 * 30
    assert memory["cross_attention_bytes_per_session"] == 94_371_840  # 2 * 512 * 12 * 128 * 30 * 2
    assert memory["history_pages_per_session"] == 18         # 21 - 3
    assert memory["session_capacity"] == 4
    tables = cli("inspect-spec", REPO / "examples" / "wan_spec_only.yaml")
    assert tables.exit_code == 0 and "Memory plan (bfloat16" in tables.stdout


# ---- weights beside the plan (#24) ---------------------------------------------------------
# spec_pipelines.WeightedPipeline planned for cuda (bfloat16, no GPU needed: the memory is
# given): KV 6,912 bytes (4 sessions of 1,536 + 768 shared); weights model 20,000 and
# encoder 30,000 bytes; the margin (an estimate): the 3GiB of activations it declares and
# the CUDA context's 1GiB.
MARGIN = 4 * 2**30
WAN_MARGIN = 3 * 2**30  # causal-Wan: 2GiB of activations (a VAE decode) + the CUDA context
KV16, MODEL16, ENCODER16 = 6_912, 20_000, 30_000


def weighted(invoke, tiny_config, memory: int | None, *args: str) -> dict:
    flags = ("--device-memory", str(memory)) if memory is not None else ()
    return as_json(invoke("inspect-spec", tiny_config("WeightedPipeline"), "--json",
                          "--device", "cuda", *flags, *args))


def test_weights_and_the_fit_in_json(invoke, tiny_config):
    data = weighted(invoke, tiny_config, MARGIN + MODEL16 + ENCODER16 + KV16)
    assert data["weights"] == {"parts": {"model": {"bytes": MODEL16, "device": "cuda"},
                                         "encoder": {"bytes": ENCODER16, "device": "cuda"}},
                               "device_bytes": MODEL16 + ENCODER16,
                               "total_bytes": MODEL16 + ENCODER16}
    assert data["fit"] == {"memory_bytes": MARGIN + MODEL16 + ENCODER16 + KV16,
                           "weight_bytes": MODEL16 + ENCODER16, "kv_bytes": KV16,
                           "margin_bytes": MARGIN,
                           "needed_bytes": MARGIN + MODEL16 + ENCODER16 + KV16, "fits": True}
    assert data["memory"]["total_bytes"] == KV16


def test_a_part_that_does_not_fit_moves_as_the_pipeline_says(invoke, tiny_config):
    data = weighted(invoke, tiny_config, MARGIN + MODEL16 + ENCODER16 + KV16 - 1)
    assert data["weights"]["parts"]["encoder"]["device"] == "cpu"
    assert data["weights"]["device_bytes"] == MODEL16
    assert (data["fit"]["needed_bytes"], data["fit"]["fits"]) == (MARGIN + MODEL16 + KV16, True)
    data = weighted(invoke, tiny_config, MARGIN + MODEL16 + KV16 - 1)
    assert data["weights"]["parts"]["encoder"]["device"] == "cpu"
    assert data["fit"]["fits"] is False


def test_a_fraction_budget_plans_with_the_memory_the_weights_leave(invoke, tiny_config):
    memory = MARGIN + MODEL16 + ENCODER16 + 100_000
    data = weighted(invoke, tiny_config, memory, "--budget", "0.5")
    assert data["weights"]["device_bytes"] == MODEL16 + ENCODER16
    assert data["memory"]["budget_bytes"] == (memory - MODEL16 - ENCODER16) // 2


def test_the_memory_unknown_leaves_auto_and_no_fit(invoke, tiny_config):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: its free memory is measured")
    data = weighted(invoke, tiny_config, None)
    assert data["weights"]["parts"]["encoder"]["device"] == "auto" and "fit" not in data
    text = invoke("inspect-spec", tiny_config("WeightedPipeline"), "--device", "cuda")
    assert "auto (the device's memory decides)" in text.stdout
    assert "fit: unknown; give --device-memory SIZE (e.g. 24GiB) to check a device" in text.stdout


def test_on_this_machine_the_free_memory_is_the_device_memory(invoke, tiny_config):
    data = as_json(invoke("inspect-spec", tiny_config("WeightedPipeline"), "--json"))
    assert data["fit"]["memory_bytes"] > 0 and data["fit"]["kv_bytes"] == 13_824


def test_weights_and_the_fit_as_tables(invoke, tiny_config):
    result = invoke("inspect-spec", tiny_config("WeightedPipeline"), "--device", "cuda",
                    "--device-memory", str(MARGIN + MODEL16 + KV16 - 1))
    assert result.exit_code == 0, result.stderr
    assert "Weights (bfloat16 run)" in result.stdout
    assert re.search(r"encoder\W+29KiB\W+cpu", result.stdout)
    assert "fits in 4.0GiB: no\n  needs 4.0GiB: weights on cuda 20KiB + KV plan 6.8KiB + " \
           "margin for activations 4.0GiB (an estimate)\n" in result.stdout


def test_a_pipeline_without_weights_gets_no_fit_verdict(invoke, tiny_config):
    """Weights not declared are not 0 bytes: saying "fits" would overclaim (#35)."""
    data = as_json(invoke("inspect-spec", tiny_config(), "--json", "--device-memory", "4GiB"))
    assert "weights" not in data and "fit" not in data and data["weights_declared"] is False
    text = invoke("inspect-spec", tiny_config(), "--device-memory", "4GiB").stdout
    assert "fit: no verdict: weights not declared (the pipeline has no weight_bytes)" in text
    assert "fits in" not in text


@pytest.mark.parametrize("memory", ["24GiB", "23.5GiB"])
def test_self_forcing_on_a_24gb_card(cli, memory):
    """docs/causal-wan.md's worked example, in a folder with Wan2.1-1.3B's configs only: the
    weights, the KV plan, and UMT5 on the GPU only if all of it and the margin fit (at
    24GiB it does, by 0.06GiB, with the plan of 2026-12-02; at 23.5GiB it goes to the CPU)."""
    pytest.importorskip("torch")
    from ardiff.pipelines.causal_wan.make_tiny import SHAPES, write_configs

    write_configs(Path("wan_models/Wan2.1-T2V-1.3B-Diffusers"), *SHAPES["wan2.1-1.3b"])
    data = as_json(cli("inspect-spec", REPO / "configs" / "self-forcing.yaml", "--json",
                       "--device-memory", memory))
    parts, fit = data["weights"]["parts"], data["fit"]
    sizes = {name: part["bytes"] for name, part in parts.items()}
    assert sizes == {"transformer": 2_844_248_192, "text_encoder": 11_361_820_672,
                     "vae": 253_785_062}
    assert fit["kv_bytes"] == data["memory"]["total_bytes"] and fit["margin_bytes"] == WAN_MARGIN
    on_gpu = sum(sizes.values()) + fit["kv_bytes"] + WAN_MARGIN <= fit["memory_bytes"]
    assert parts["text_encoder"]["device"] == ("cuda" if on_gpu else "cpu")
    assert on_gpu == (memory == "24GiB")
    assert fit["weight_bytes"] == sum(sizes.values()) - (0 if on_gpu else sizes["text_encoder"])
    assert fit["needed_bytes"] == fit["weight_bytes"] + fit["kv_bytes"] + WAN_MARGIN
    assert fit["fits"] and data["model_layout"] == "diffusers"


@pytest.mark.parametrize("value", ["lots", "0.8", "0"])
def test_bad_device_memory_exits_2_with_one_line(invoke, tiny_config, value):
    assert_one_line_error(invoke("inspect-spec", tiny_config(), "--device-memory", value), 2,
                          f"error: --device-memory: '{value}' is not a size in bytes; give the "
                          f"device's memory like 24GiB, 80GB or 25769803776")


# ---- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--set", "runtime.kv.windw_frames=3"],
     "error: runtime.kv.windw_frames: unknown key; did you mean 'window_frames'?"),
    (["--set", "novalue"], "error: --set: 'novalue' is not KEY=VALUE"),
    (["--dtype", "fp32"], "error: runtime.dtype: 'fp32' (str) is not allowed"),
    (["--budget", "lots"], "error: runtime.memory_budget: 'lots' is not a size"),
    (["--budget", "0"], "must be more than 0 bytes"),
    (["--page-tokens", "0"], "error: runtime.kv.page_tokens: 0 is invalid; it must be > 0"),
    (["--set", "runtime.device=gpu"], "error: runtime.device: 'gpu' is not a device"),
    (["--set", "pipeline.args.window_frames=0"],
     "error: spec.window_frames: 0 is invalid; it must be an integer > 0"),
])
def test_bad_options_exit_2_with_one_line(invoke, tiny_config, args, message):
    assert_one_line_error(invoke("inspect-spec", tiny_config(), *args), 2, message)


@pytest.mark.parametrize("attr, message", [
    ("InvalidSpecPipeline", "error: spec.num_layers: 0 is invalid; it must be an integer > 0"),
    ("Nope", "has no attribute 'Nope'"),
    ("MissingMethodsPipeline", "lacks bind_ar_diffusion_state, close_ar_diffusion_session, "
                               "generate_block"),
    ("ConstructorRaisesPipeline", "raised ValueError: no such checkpoint: /nowhere.safetensors"),
    ("SpecRaisesPipeline", "ar_diffusion_kv_cache_spec() raised RuntimeError"),
    ("WrongSpecTypePipeline", "ar_diffusion_kv_cache_spec() returned a dict"),
])
def test_bad_pipelines_exit_2_with_one_line(invoke, tiny_config, attr, message):
    assert_one_line_error(invoke("inspect-spec", tiny_config(attr)), 2, message)


@pytest.mark.parametrize("attr", ["InvalidSpecPipeline", "ConstructorRaisesPipeline"])
def test_bad_pipelines_exit_2_through_the_script_from_another_folder(cli, tiny_config, attr):
    assert_one_line_error(cli("inspect-spec", tiny_config(attr)), 2, "error: ")


def test_bad_config_files_exit_2(cli, write_config):
    assert_one_line_error(cli("inspect-spec", "nope.yaml"), 2,
                          "error: config: 'nope.yaml' does not exist or is not a file")
    broken = write_config("pipeline:\n  entry: a:b\n bad: 1\n")
    assert_one_line_error(cli("inspect-spec", broken), 2, "YAML syntax error at line 3, column 2")
    no_module = write_config("pipeline: {entry: 'ardiff_no_such_module_xyz:P'}\n")
    assert_one_line_error(cli("inspect-spec", no_module), 2,
                          "error: pipeline.entry: module 'ardiff_no_such_module_xyz' not found")


def test_json_errors_are_one_line_too(invoke, tiny_config):
    assert_one_line_error(invoke("inspect-spec", tiny_config(), "--json", "--dtype", "fp32"), 2,
                          "error: runtime.dtype")


def test_no_session_fits_exits_3(cli, tiny_config):
    # needs 1536 shared + 3072 per session = 4608 bytes; 4000 is 608 short
    result = cli("inspect-spec", tiny_config(), "--budget", "4000")
    assert_one_line_error(result, 3, "error: runtime.memory_budget: 3.9KiB cannot hold one "
                                     "session (needs 4.5KiB: 3.0KiB per session + 1.5KiB shared, "
                                     "short by 608B)")
    assert "raise the budget to at least 4.5KiB" in result.stderr


def test_debug_shows_the_traceback(cli, tiny_config):
    result = cli("inspect-spec", tiny_config(), "--budget", "4000", "--debug")
    assert result.exit_code == 3
    assert "Traceback" in result.stderr and "CapacityError" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: runtime.memory_budget: ")
    result = cli("inspect-spec", tiny_config("ConstructorRaisesPipeline"), "--debug")
    assert result.exit_code == 2
    assert "ValueError: no such checkpoint" in result.stderr   # the cause is shown too


def test_usage_errors_exit_2(cli, tiny_config):
    assert cli("inspect-spec").exit_code == 2
    assert cli("inspect-spec", tiny_config(), "--no-such-flag").exit_code == 2
    assert cli("inspect-spec", tiny_config(), "--page-tokens", "many").exit_code == 2


def test_help(cli):
    result = cli("--help")
    assert result.exit_code == 0 and "inspect-spec" in result.stdout


def test_help_says_what_it_runs_and_what_it_does_not(invoke):
    """#25: not a "dry run" that runs nothing: it constructs the pipeline (the config's code),
    loads no weights and allocates nothing; the docs say the same."""
    result = invoke("inspect-spec", "--help")
    text = " ".join(result.stdout.replace("│", " ").split())
    assert result.exit_code == 0
    for said in ("constructs the pipeline", "trust a config as you would a script",
                 "loads no weights and allocates nothing"):
        assert said in text
    assert "dry run" not in text
    configs = " ".join((REPO / "docs" / "configs.md").read_text().split())
    commands = " ".join((REPO / "docs" / "commands.md").read_text().split())
    assert "**Trust a config as you would trust a script**" in configs
    assert "it constructs the pipeline (running the config's code), loads no weights and " \
           "allocates nothing" in commands


def test_fraction_budget_on_a_missing_cuda_device_exits_2(invoke, tiny_config):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert_one_line_error(
        invoke("inspect-spec", tiny_config(), "--set", "runtime.device=cuda", "--budget", "0.5"), 2,
        "error: runtime.memory_budget: 0.5 of free memory needs the device's free memory, but "
        "runtime.device: 'cuda' was requested but CUDA is not available")


def test_inspect_spec_plans_auto_on_cuda_in_bfloat16_without_a_gpu(cli, tiny_config):
    cpu = as_json(cli("inspect-spec", tiny_config(), "--json"))
    gpu = as_json(cli("inspect-spec", tiny_config(), "--json", "--device", "cuda"))
    assert (cpu["effective"]["dtype"], cpu["effective"]["device"]) == ("float32", "cpu")
    assert (gpu["effective"]["dtype"], gpu["effective"]["device"]) == ("bfloat16", "cuda")
    assert gpu["memory"]["page_bytes"] * 2 == cpu["memory"]["page_bytes"]
