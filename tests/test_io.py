"""Saved data: safetensors + JSON, atomic, and never unpickled."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import pytest
import torch

from hookscope._io import atomic_write, load_bundle, save_bundle


class Payload:
    ran = False

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/hookscope-pwned",))


def test_round_trip_keeps_tensors_and_document(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    tensors = {"x": torch.arange(6.0).reshape(2, 3), "n": torch.tensor([3], dtype=torch.int64)}
    save_bundle(path, tensors, {"layers": ["a", "b"], "inf": float("inf")}, "thing")
    loaded, document = load_bundle(path, "thing")
    assert torch.equal(loaded["x"], tensors["x"]) and torch.equal(loaded["n"], tensors["n"])
    assert document == {"layers": ["a", "b"], "inf": float("inf")}


def test_wrong_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save_bundle(path, {}, {}, "thing")
    with pytest.raises(ValueError, match="must hold hookscope data of kind 'other', found 'thing'"):
        load_bundle(path, "other")


def test_pickle_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    path = tmp_path / "evil.safetensors"
    path.write_bytes(pickle.dumps(Payload()))
    marker = Path("/tmp/hookscope-pwned")
    marker.unlink(missing_ok=True)
    with pytest.raises(ValueError, match="truncated, corrupt or not a safetensors file"):
        load_bundle(path, "thing")
    assert not marker.exists()


def test_truncated_file_and_huge_header_fail_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save_bundle(path, {"x": torch.ones(100)}, {}, "thing")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable hookscope safetensors file"):
        load_bundle(path, "thing")
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(ValueError, match="declares a 4611686018427387904-byte header"):
        load_bundle(path, "thing")
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="is truncated: 3 bytes"):
        load_bundle(path, "thing")


def test_a_crash_during_a_write_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.safetensors"
    save_bundle(path, {"x": torch.ones(2)}, {"v": 1}, "thing")

    def crash(*args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        save_bundle(path, {"x": torch.zeros(2)}, {"v": 2}, "thing")
    monkeypatch.undo()
    tensors, document = load_bundle(path, "thing")
    assert document == {"v": 1} and torch.equal(tensors["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]  # no temporary file left behind


def test_atomic_write_creates_folders_and_writes_text(tmp_path: Path) -> None:
    target = atomic_write(tmp_path / "deep" / "note.txt", "héllo")
    assert target.read_text(encoding="utf-8") == "héllo"


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        target = atomic_write(tmp_path / "a.txt", "x")
    finally:
        os.umask(previous)
    assert target.stat().st_mode & 0o777 == 0o644
