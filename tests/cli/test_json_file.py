"""The --json stats file is replaced whole (a reader never sees half of it), keeps the old
file's permissions, follows a symlink to its target, and still writes to a device."""

from __future__ import annotations

import json
import os
import stat
import threading

from ardiff_cli._options import write_json_file


def test_a_new_stats_file_gets_the_usual_permissions_and_no_work_file(tmp_path):
    path = tmp_path / "stats.json"
    assert write_json_file(str(path), {"a": 1}) is None
    assert json.loads(path.read_text()) == {"a": 1}
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]


def test_an_existing_file_keeps_its_mode_and_a_symlink_is_followed(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert write_json_file(str(link), {"b": 2}) is None
    assert link.is_symlink() and json.loads(real.read_text()) == {"b": 2}
    assert stat.S_IMODE(real.stat().st_mode) == 0o600


def test_readers_see_the_old_or_the_new_file_never_a_mix(tmp_path):
    path = tmp_path / "stats.json"
    big = {"rows": ["x" * 200] * 2000}
    write_json_file(str(path), big)
    seen, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            seen.append(json.loads(path.read_text()))  # raises on a torn file

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20):
            write_json_file(str(path), {"rows": [str(i) * 200] * 2000})
    finally:
        stop.set()
        reader.join()
    assert seen and all(len(doc["rows"]) == 2000 for doc in seen)


def test_a_device_is_written_directly_and_a_full_one_is_reported():
    message = write_json_file("/dev/full", {"a": 1}, kept="the video is kept; ")
    assert message is not None and message.startswith("--json: cannot write '/dev/full'")
    assert "the video is kept" in message
