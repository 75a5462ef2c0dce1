"""The import-layer check (`lint-imports`, contracts in pyproject.toml) holds on the tree and
fails on an upward import: the four loops the layers replaced, injected into a copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
# One upward import per loop the old tree had: a job that dispatches to the launcher, process
# groups that build runners, a writer that reads the rollout, sizes that read the config.
UPWARD = {
    "ardiff/rollout/job.py": ("ardiff.rollout.job", "ardiff.launch.parent"),
    "ardiff/distributed/topology.py": ("ardiff.distributed.topology", "ardiff.engine.build"),
    "ardiff/video/writer.py": ("ardiff.video.writer", "ardiff.rollout.paths"),
    "ardiff/sizes.py": ("ardiff.sizes", "ardiff.config.run"),
}

pytestmark = pytest.mark.extra("lint")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache", str(REPO / "pyproject.toml")], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def copy_tree(to: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.safetensors")
    shutil.copytree(REPO / "ardiff", to / "ardiff", ignore=ignore)
    shutil.copytree(REPO / "cli", to / "ardiff_cli", ignore=ignore)
    return to


@pytest.mark.slow
def test_the_layers_hold_and_an_upward_import_breaks_them(tmp_path):
    tree = copy_tree(tmp_path)
    kept = lint(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    for path, (_, target) in UPWARD.items():
        with open(tree / path, "a", encoding="utf-8") as module:
            module.write(f"\nimport {target}  # an upward import\n")
    broken = lint(tree)
    assert broken.returncode != 0
    for importer, target in UPWARD.values():
        assert f"{importer} -> {target}" in broken.stdout, broken.stdout
