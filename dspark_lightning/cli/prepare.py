"""``dspark-lightning prepare`` / ``check-cache``: a recipe's data stages as their own commands (``docs/training.md``).

    dspark-lightning prepare --config R.yaml                                   one process (its GPU, else the CPU)
    torchrun --nproc_per_node 8 -m dspark_lightning.cli prepare --config R.yaml  a rank per GPU; rank 0 merges
    dspark-lightning prepare --config R.yaml --rank 3 --world_size 8           any scheduler, one call per rank ...
    dspark-lightning prepare --config R.yaml --merge --world_size 8            ... then the merge, once
    dspark-lightning check-cache --config R.yaml                               sha256 of every cached shard

Only the recipe's ``target:`` and ``data:`` sections and its ``trainer.accelerator`` / ``trainer.precision`` are
read, with Lightning's own parser, the same DSparkDataModule signature as ``fit`` and the same link of the target
(:func:`~dspark_lightning.lightning.config.target_for_trainer`: a CPU recipe's target is fp32 even where a GPU
prepares it), so a recipe means the same data to both commands; ``--data.<key>=...``, ``--target.<key>=...`` and
``--trainer.accelerator`` / ``--trainer.precision`` overrides work as in ``fit``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..data.features.cache import check_shards
from ..data.prepare import SPLITS, DataPaths
from ..errors import user_error_within
from ..lightning import recipe_checks
from ..lightning.config import TargetConfig, target_for_trainer
from ..lightning.datamodule import DSparkDataModule

TRAINER_KEYS = ("accelerator", "precision")  # what decides the target's dtype (target_for_trainer)


def _data_section_only(argv: list[str]) -> list[str]:
    """Replace each ``--config FILE`` by its ``target:`` and ``data:`` sections and the trainer's :data:`TRAINER_KEYS`
    (a YAML string), so the other trainer keys and the model's are ignored."""
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
            sections = {k: recipe.get(k) or {} for k in ("target", "data")}
            trainer = recipe.get("trainer") if isinstance(recipe.get("trainer"), dict) else {}
            if any(k in trainer for k in TRAINER_KEYS):
                sections["trainer"] = {k: trainer[k] for k in TRAINER_KEYS if k in trainer}
            out += ["--config", yaml.safe_dump(sections)]
            continue
        out.append(arg)
        i += 1
    return out


def parse_recipe(prog: str, argv: list[str], func: Callable) -> tuple[DSparkDataModule, dict[str, Any]]:
    """The data module of the recipe (``--config``, ``--data.<key>=...``) and ``func``'s other keyword arguments,
    from the flags jsonargparse makes of its signature."""
    from jsonargparse import ActionConfigFile
    from lightning.pytorch.cli import LightningArgumentParser

    parser = LightningArgumentParser(
        prog=f"dspark-lightning {prog}", exit_on_error=False, description=(func.__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a recipe (its target: and data: sections are read)")
    parser.add_class_arguments(TargetConfig, "target")
    parser.add_argument("--trainer.accelerator", type=str | dict | None, default="auto", help="as in fit: cpu keeps "
                        "a target with dtype null in fp32")  # fmt: skip
    parser.add_argument("--trainer.precision", type=int | str | None, default=None, help="as in fit: 32/64-bit keeps "
                        "a target with dtype null in fp32")  # fmt: skip
    parser.add_lightning_class_args(DSparkDataModule, "data")
    parser.link_arguments(("target", "trainer.accelerator", "trainer.precision"), "data.target", target_for_trainer)
    parser.add_function_arguments(func, skip={"data"})
    cfg = parser.parse_args(_data_section_only(argv))
    recipe_checks.data_args(cfg.data, DSparkDataModule)
    try:
        data = parser.instantiate(cfg).data
    except ValueError as exc:  # a constructor refusing a value, wrapped by jsonargparse
        if (ours := user_error_within(exc)) is None:
            raise
        raise ours from None
    params = [p for p in inspect.signature(func).parameters if p != "data"]
    return data, {p: cfg[p] for p in params}


def _world(rank: int | None, world_size: int | None) -> tuple[int, int, bool]:
    """(rank, world size, launched by torchrun): explicit arguments win over the torch.distributed variables."""
    if rank is not None or world_size is not None:
        return rank or 0, world_size or 1, False
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


def prepare(
    data: DSparkDataModule,
    rank: int | None = None,
    world_size: int | None = None,
    merge: bool = False,
    check_cache: bool = False,
    device: str | None = None,
) -> None:
    """Regenerate responses and cache target features of a recipe's data, sharded by rank (rank 0 merges).

    Args:
        data: the recipe's data module
        rank: this rank (default: $RANK, else 0)
        world_size: ranks (default: $WORLD_SIZE, else 1)
        merge: only merge the finished ranks (once, after all)
        check_cache: check the sha256 of every shard once the data is merged (what `check-cache` does)
        device: default: this rank's GPU, else cpu
    """
    import contextlib

    from .. import locks

    recipe_checks.rank_args(rank, world_size)
    data.prepare_device = device
    rank, world, launched = _world(rank, world_size)
    job = data.prepare_job()
    with contextlib.ExitStack() as held:
        for folder in lock_folders(job, rank, world, launched, merge):
            held.enter_context(locks.folder_lock(folder, "prepare"))
        _prepare(data, job, rank, world, launched, merge, check_cache)


def _prepare(dm: DSparkDataModule, job: Any, rank: int, world: int, launched: bool, merge: bool, check: bool) -> None:
    if merge:
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
        if check:
            check_cache(dm)
    elif world > 1 and not launched:
        print(f"[dspark-lightning] rank {rank}/{world} done; merge with: prepare --merge --world_size {world}")


def check_cache(data: DSparkDataModule) -> None:
    """The sha256 of every cached feature shard of a recipe's data.

    Args:
        data: the recipe's data module
    """
    if data.features != "cached":
        print("[dspark-lightning] check-cache: data.features is online, there are no cached shards to check")
        return
    paths = DataPaths(Path(data.work_dir))
    for split in SPLITS:
        st = check_shards(paths.cache(split))
        print(f"[dspark-lightning] check-cache {paths.cache(split)}: {st['shards']} shards, {st['samples']} samples ok")


def run_recipe_command(command: str, argv: list[str]) -> None:
    """``dspark-lightning prepare`` / ``check-cache``: :func:`prepare` / :func:`check_cache` with the recipe's data
    and the flags."""
    func = prepare if command == "prepare" else check_cache
    data, kwargs = parse_recipe(command, argv, func)
    func(data, **kwargs)
