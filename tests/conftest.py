import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup otherwise hangs ~25 s

# Lightning's loggers get a stream handler on sys.stderr at first import: imported here, before a test's capsys
# replaces sys.stderr, so a test that imports it first does not leave later tests a handler on a closed stream.
import lightning.pytorch  # noqa: E402, F401
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests need a CUDA device: without one they are skipped (CPU CI stays green)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """Profiles a test measures are kept however busy the machine is (test_busy_profiles.py tests that rule)."""
    from dspark_lightning.infer.profiling import busy

    monkeypatch.setattr(busy, "BUSY_SHARE", 1.01)


@pytest.fixture(scope="session")
def tiny_target():
    from dspark_lightning import load_target

    return load_target("tiny-debug")


@pytest.fixture(scope="session")
def varied_target():
    """A tiny random Llama whose greedy and sampled continuations vary (see tests/infer/conftest.py)."""
    from dspark_lightning.testing import random_target

    return random_target(vocab=260, hidden=64, layers=4, init=0.3, seed=0)


@pytest.fixture(scope="session")
def tiny_batch(tiny_target):
    """Features of two random sequences from the tiny target: (context, hidden, ids)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (2, 24), generator=g)
    out = tiny_target(ids)
    return out.context, out.hidden, ids


class DiskFull:
    """Writes under ``root`` fail with ENOSPC, as on a disk that fills up: ``os.write`` once ``room`` bytes went
    there (a short write first, as the kernel does), or every ``os.fsync`` there (``on="fsync"``: NFS, quotas).
    ``free()`` makes space again."""

    def __init__(self, monkeypatch, root, room: int = 0, on: str = "write") -> None:
        import errno

        self.root, self.room, self.hits, self.active = os.path.realpath(root), room, 0, True
        real_write, real_fsync = os.write, os.fsync

        def under_root(fd: int) -> bool:
            try:
                return self.active and os.readlink(f"/proc/self/fd/{fd}").startswith(self.root)
            except OSError:
                return False

        def write(fd, data):
            if on != "write" or not under_root(fd):
                return real_write(fd, data)
            if self.room <= 0:
                self.hits += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            view = memoryview(data).cast("B")[: self.room]
            n = real_write(fd, view)
            self.room -= n
            return n

        def fsync(fd):
            if on == "fsync" and under_root(fd):
                self.hits += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_fsync(fd)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "fsync", fsync)

    def free(self) -> None:
        self.active = False


@pytest.fixture
def disk_full(monkeypatch):
    """``disk_full(root, room=0, on="write")``: make the file system under ``root`` full (see :class:`DiskFull`)."""
    return lambda root, room=0, on="write": DiskFull(monkeypatch, root, room, on)


def _snapshot(root) -> dict[str, bytes]:
    from pathlib import Path

    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def snapshot():
    """``snapshot(root)``: every file below ``root`` (relative path -> bytes), hidden ones included: compare before
    and after a failed write (same bytes, no temp debris)."""
    return _snapshot


@pytest.fixture
def registered():
    """Register components for one test, as a plugin would (``registered("scheduler", "name")(cls)``); the registry
    is restored when the test ends, whatever registered during it (a plugin loaded by the test included)."""
    from dspark_lightning import registry

    registry.names("scheduler")  # the built-ins are loaded before the snapshot
    saved = {kind: dict(table) for kind, table in registry._REGISTRY.items()}

    def add(kind: str, name: str):
        return registry.register(kind, name)

    yield add
    for kind, table in registry._REGISTRY.items():
        table.clear()
        table.update(saved[kind])
