"""``dspark-lightning prepare`` / ``check-cache``: a recipe's data stages as their own commands (``docs/training.md``).

    dspark-lightning prepare --config R.yaml                                   one process (its GPU, else the CPU)
    torchrun --nproc_per_node 8 -m dspark_lightning.cli prepare --config R.yaml  a rank per GPU; rank 0 merges
    dspark-lightning prepare --config R.yaml --rank 3 --world_size 8           any scheduler, one call per rank ...
    dspark-lightning prepare --config R.yaml --merge --world_size 8            ... then the merge, once
    dspark-lightning check-cache --config R.yaml                               sha256 of every cached shard

Only the recipe's ``data:`` section is read, with Lightning's own parser and the same DSparkDataModule signature as
``fit``, so a recipe means the same thing to both commands; ``--data.<key>=...`` overrides work as in ``fit``.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..data.cache import verify_cache
from ..data.prepare import SPLITS, DataPaths
from ..lightning import recipe_checks
from ..lightning.datamodule import DSparkDataModule


def _data_section_only(argv: list[str]) -> list[str]:
    """Replace each ``--config FILE`` by its ``data:`` section (a YAML string), so trainer / model keys are ignored."""
    import yaml

    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" or arg.startswith("--config="):
            path = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            if not Path(path).is_file():
                raise FileNotFoundError(f"recipe {path!r} does not exist")
            recipe = yaml.safe_load(Path(path).read_text()) or {}
            out += ["--config", yaml.safe_dump({"data": recipe.get("data") or {}})]
            continue
        out.append(arg)
        i += 1
    return out


def _parse(prog: str, argv: list[str], extra: bool) -> tuple[DSparkDataModule, Any]:
    from jsonargparse import ActionConfigFile
    from lightning.pytorch.cli import LightningArgumentParser

    parser = LightningArgumentParser(prog=f"dspark-lightning {prog}", exit_on_error=False, description=__doc__)
    parser.add_argument("--config", action=ActionConfigFile, help="a recipe (its data: section is read)")
    parser.add_lightning_class_args(DSparkDataModule, "data")
    if extra:
        parser.add_argument("--rank", type=int | None, default=None, help="this rank (default: $RANK, else 0)")
        parser.add_argument("--world_size", type=int | None, default=None, help="ranks (default: $WORLD_SIZE, else 1)")
        parser.add_argument("--merge", action="store_true", help="only merge the finished ranks (once, after all)")
        parser.add_argument("--verify", action="store_true", help="hash every shard once the data is merged")
        parser.add_argument("--device", type=str | None, default=None, help="default: this rank's GPU, else cpu")
    cfg = parser.parse_args(_data_section_only(argv))
    recipe_checks.data_args(cfg.data, DSparkDataModule)
    if extra:
        recipe_checks.rank_args(cfg.rank, cfg.world_size)
    return parser.instantiate_classes(cfg).data, cfg


def _world(cfg: Any) -> tuple[int, int, bool]:
    """(rank, world size, launched by torchrun): explicit arguments win over the torch.distributed variables."""
    if cfg.rank is not None or cfg.world_size is not None:
        return cfg.rank or 0, cfg.world_size or 1, False
    world = int(os.environ.get("WORLD_SIZE", 1))
    return int(os.environ.get("RANK", 0)), world, world > 1 and "MASTER_ADDR" in os.environ


def lock_folders(job: Any, rank: int, world: int, launched: bool, merge: bool) -> list[Path]:
    """The folders this process writes, locked for as long as it runs (one writer per folder): the work dir for a
    single process, rank 0 of a torchrun job and ``--merge``; each rank's own folder where ranks run side by side."""
    work = Path(job.work_dir)
    if merge:
        return [work]
    folders = [job.paths.rank_dir(job.fingerprint, rank, world)] if world > 1 else []
    return [work, *folders] if rank == 0 and (world == 1 or launched) else folders


def run_prepare(argv: list[str]) -> None:
    import contextlib

    from .. import locks

    dm, cfg = _parse("prepare", argv, extra=True)
    dm.prepare_device = cfg.device
    rank, world, launched = _world(cfg)
    job = dm.prepare_job()
    with contextlib.ExitStack() as held:
        for folder in lock_folders(job, rank, world, launched, cfg.merge):
            held.enter_context(locks.folder_lock(folder, "prepare"))
        _prepare(dm, cfg, job, rank, world, launched)


def _prepare(dm: DSparkDataModule, cfg: Any, job: Any, rank: int, world: int, launched: bool) -> None:
    if cfg.merge:
        job.merge(world)
    elif launched:
        import torch.distributed as dist

        # gloo: the group only synchronises; a slow rank may regenerate for hours, hence the long timeout
        dist.init_process_group("gloo", timeout=timedelta(days=2))
        try:
            job.run_rank(rank, world)
            dist.barrier()
            if rank == 0:
                job.merge(world)
            dist.barrier()
        finally:
            dist.destroy_process_group()
    else:
        job.run(rank, world)
    if rank == 0 and job.is_done():
        print(f"[dspark-lightning] prepared data for {world} rank(s) -> {DataPaths(Path(dm.work_dir)).prepared}")
        dm.report_roofline()
        if cfg.verify:
            _check_cache(dm)
    elif world > 1 and not launched:
        print(f"[dspark-lightning] rank {rank}/{world} done; merge with: prepare --merge --world_size {world}")


def _check_cache(dm: DSparkDataModule) -> None:
    if dm.features != "cached":
        print("[dspark-lightning] check-cache: data.features is online, there are no cached shards to check")
        return
    paths = DataPaths(Path(dm.work_dir))
    for split in SPLITS:
        st = verify_cache(paths.cache(split))
        print(f"[dspark-lightning] check-cache {paths.cache(split)}: {st['shards']} shards, {st['samples']} samples ok")


def run_check_cache(argv: list[str]) -> None:
    """``dspark-lightning check-cache``: the sha256 of every cached feature shard of a recipe's data."""
    dm, _ = _parse("check-cache", argv, extra=False)
    _check_cache(dm)


def run_verify(argv: list[str]) -> None:
    """The former name of ``check-cache`` ("verify" now means only the target's forward over drafts)."""
    print("[dspark-lightning] `verify` is now `check-cache`; running it", file=sys.stderr)
    run_check_cache(argv)
