"""Atomic writes: whole files under the real name, nothing left behind, a normal file mode."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rlflow.fileio import write_bytes_atomic, write_json_atomic, write_text_atomic


def test_writes_replace_whole_files_and_leave_no_temporaries(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    write_bytes_atomic(target, b"first")
    write_bytes_atomic(target, b"second, longer")
    assert target.read_bytes() == b"second, longer"
    write_text_atomic(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    write_json_atomic(tmp_path / "d.json", {"b": 1, "a": [1, 2]})
    assert json.loads((tmp_path / "d.json").read_text()) == {"a": [1, 2], "b": 1}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "d.json",
        "out.bin",
        "t.txt",
    ]


def test_file_mode_follows_the_umask_not_mkstemp(tmp_path):
    target = write_bytes_atomic(tmp_path / "model.onnx", b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "keep.json"
    write_json_atomic(target, {"ok": True})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["keep.json"]
