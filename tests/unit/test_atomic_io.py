"""Writes are whole or absent and survive a full disk (dspark_lightning/atomic.py), checkpoints included; a
``--ckpt_path last`` never picks a truncated checkpoint."""

import errno
import os
import subprocess
import sys
import time

import pytest
import torch

from dspark_lightning.atomic import DiskFullError, append_durable, atomic_dir, atomic_write, human_bytes


def test_atomic_write_replaces_keeps_permissions_and_leaves_nothing(tmp_path):
    path = tmp_path / "a.json"
    atomic_write(path, "one\n")
    os.chmod(path, 0o640)
    atomic_write(path, b"two\n")
    assert path.read_bytes() == b"two\n" and (path.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    new = atomic_write(tmp_path / "sub" / "b.txt", "x")  # parents are made; mode follows the umask, not 0o600
    assert new.read_text() == "x" and new.stat().st_mode & 0o044


@pytest.mark.parametrize("on,room", [("write", 0), ("write", 5), ("fsync", 0)])
def test_atomic_write_on_a_full_disk_keeps_the_previous_file(tmp_path, disk_full, on, room):
    path = tmp_path / "calibration_T1.json"
    atomic_write(path, "previous\n")
    disk = disk_full(tmp_path, room=room, on=on)
    with pytest.raises(DiskFullError) as info:
        atomic_write(path, "x" * 10_000)
    assert disk.hits >= 1
    assert path.read_bytes() == b"previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration_T1.json"]  # the temp is gone
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and "\n" not in msg
    assert str(path) in msg and human_bytes(10_000) in msg and "free" in msg


def test_a_killed_writers_temp_is_removed_and_a_live_ones_left(tmp_path):
    path = tmp_path / "f.json"
    dead = tmp_path / ".f.json.tmp-999999999-abc"  # no such pid
    dead.write_text("half")
    live_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".f.json.tmp-{live_proc.pid}-abc"
        live.write_text("being written")
        atomic_write(path, "new")
        assert not dead.exists() and live.exists() and path.read_text() == "new"
    finally:
        live_proc.kill()
        live_proc.wait()


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_atomic_dir_swaps_whole_folders_and_carries_foreign_files(tmp_path):
    final = tmp_path / "export"
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
        (tmp / "b").write_text("1")
    with atomic_dir(final, carry=lambda name: name == "notes.txt") as tmp:
        (final / "notes.txt").write_text("user's")  # a file the writer does not own
        (tmp / "a").write_text("2")
    assert _tree(final) == {"a": b"2", "notes.txt": b"user's"}  # b is gone: the new folder replaced the old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_atomic_dir_failure_leaves_the_previous_folder(tmp_path, disk_full):
    final = tmp_path / "export"
    with atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("{}")
        atomic_write(tmp / "model.safetensors", b"w" * 100)
    before = _tree(final)
    with pytest.raises(RuntimeError, match="boom"), atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("{new}")
        raise RuntimeError("boom")
    disk_full(tmp_path, room=50)
    with pytest.raises(DiskFullError) as info, atomic_dir(final) as tmp:
        atomic_write(tmp / "model.safetensors", b"n" * 1000)
    assert _tree(final) == before and sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert str(final) in str(info.value) and "folder" in str(info.value)


def test_a_swap_killed_between_its_renames_gets_the_previous_folder_back(tmp_path):
    final = tmp_path / "d"
    with atomic_dir(final) as tmp:
        (tmp / "config.json").write_text("old")
    final.rename(tmp_path / ".d.old-999999999-ab")  # killed after renaming the old folder away
    (tmp_path / ".d.tmp-999999999-cd").mkdir()  # ... with its new one not yet renamed in
    with pytest.warns(UserWarning, match="restoring"), pytest.raises(RuntimeError), atomic_dir(final) as tmp:
        raise RuntimeError("this export fails too")
    assert _tree(final) == {"config.json": b"old"} and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_append_durable_cuts_a_failed_append_back(tmp_path, disk_full):
    path = tmp_path / "rows.jsonl"
    append_durable(path, '{"id": "a"}\n')
    disk_full(tmp_path, room=7)  # half a row fits
    with pytest.raises(DiskFullError, match="rows.jsonl"):
        append_durable(path, '{"id": "b", "turns": []}\n')
    assert path.read_bytes() == b'{"id": "a"}\n'


# --- checkpoints -------------------------------------------------------------------------------------------------
def test_checkpoint_io_on_a_full_disk_keeps_the_previous_checkpoint(tmp_path, disk_full):
    from dspark_lightning.lightning.checkpoint_io import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(10.0)}, path)
    before = path.read_bytes()
    disk_full(tmp_path, room=3000)
    with pytest.raises(DiskFullError, match="last.ckpt"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(100_000)}, path)
    assert path.read_bytes() == before and os.listdir(path.parent) == ["last.ckpt"]
    assert torch.load(path, map_location="cpu", weights_only=False)["step"] == 1


def test_last_skips_a_truncated_checkpoint_for_the_newest_readable(tmp_path, capsys):
    from dspark_lightning.checks import UsageError
    from dspark_lightning.cli.fit import newest_readable
    from dspark_lightning.lightning.checkpoint_io import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    good, last = tmp_path / "step=2.ckpt", tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 2}, good)
    time.sleep(0.01)
    io.save_checkpoint({"step": 3, "w": torch.zeros(1000)}, last)
    last.write_bytes(last.read_bytes()[:700])  # a copy that broke off
    assert newest_readable([good, last]) == good
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 and "skipping unreadable" in out and str(last) in out and str(good) in out
    good.write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(UsageError, match="no readable checkpoint") as info:
        newest_readable([good, last])
    assert "\n" not in str(info.value)
