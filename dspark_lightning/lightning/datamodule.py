"""DSparkDataModule: Lightning glue over the Lightning-free stages in ``dspark_lightning.data``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import ConcatDataset, DataLoader, Subset

from .. import checks
from ..checks import UsageError
from ..data.features.anchors import AnchorCollator
from ..data.features.cache import CacheError, FeatureCache
from ..data.features.extract import resolve_feature_dtype
from ..data.features.modes import Cached, Online, Streamed
from ..data.features.stream import ShardStream
from ..data.features.vocab import response_token_counts
from ..data.prepare import (
    DataPaths,
    PrepareJob,
    check_caches,
    expected_meta,
    first_prompts,
    open_split,
    prompt_of,
    tokenized_split,
)
from ..data.prompts.curate import Curation, needs_tokenizer, repeat_index
from ..data.prompts.mixture import curated_mixture, mixture
from ..data.prompts.sources import build_source
from ..data.regen.config import RegenConfig
from ..data.regen.regenerate import load_conversations
from ..devices import decode_bf16_faster, dtype_name, resolve_device, resolve_dtype
from ..registry import Component, build
from .config import TargetConfig, as_config, target_config

DEFAULT_SOURCES = [{"class_path": "gsm_symbolic", "init_args": {"limit": 64}},
                   {"class_path": "humaneval", "init_args": {"limit": 64}}, "mtbench"]  # fmt: skip


class DSparkDataModule(L.LightningDataModule):
    """Prompts -> target-regenerated responses -> target features -> anchor-packed batches.

    Args:
        target: the target that writes the responses and whose features are cached (:class:`~.config.TargetConfig`,
            or its name): the recipe's ``target:`` section, which ``dspark-lightning fit`` gives to the model and the
            data alike; required (a recipe without one would otherwise train against some default target without
            saying so).
        sources: prompt sources, each a registered name or ``{class_path: NAME, init_args: {...}}``: its own
            arguments and the curation options every source takes (:class:`~dspark_lightning.data.prompts.sources.
            PromptSource`).
        heldout_fraction: fraction of prompts held out for validation / evaluation / calibration.
        split_seed: seed of the hash-based train / held-out split.
        work_dir: where responses, feature caches and prepare_stats.json go.
        regen: response regeneration settings.
        max_length: truncate conversations to this many tokens.
        min_supervised: drop conversations with fewer supervised (response) tokens.
        features: how training reads the target's features: ``cached`` (written once by ``prepare``, read map-style),
            ``streamed`` (the same shards streamed per rank and worker), ``online`` (the target runs in the training
            step); a name or ``{class_path: NAME, init_args: {...}}`` with the mode's own settings
            (:mod:`dspark_lightning.data.features.modes`: extra work dirs and a training subset for ``cached``, the
            cache URL and shuffle buffer for ``streamed``).
        feature_dtype: storage precision of features, the same for both paths.
        batch_size: sequences per micro-batch.
        max_anchors: anchors sampled per sequence (the paper: up to 512).
        num_workers: DataLoader workers.
        seed: seed of regeneration sampling and anchor sampling.
        curation: mixture-wide checks of the training prompts: decontamination against held-out sets and public
            benchmarks, exact and near de-duplication (:class:`~dspark_lightning.data.prompts.curate.Curation`;
            null = none).
            Per-source filters (``language``, ``min_tokens``, ``max_tokens``, ``sample``, ``weight``) are each
            source's ``init_args``.
    """

    def __init__(
        self,
        target: TargetConfig | str,
        sources: list[Component] | None = None,
        heldout_fraction: float = 0.05,
        split_seed: int = 42,
        work_dir: str = "outputs/data",
        regen: RegenConfig | None = None,
        max_length: int = 1024,
        min_supervised: int = 14,
        features: Component = "cached",  # type: ignore[assignment]
        feature_dtype: str = "bfloat16",
        batch_size: int = 4,
        max_anchors: int = 64,
        num_workers: int = 0,
        seed: int = 42,
        curation: Curation | None = None,
    ) -> None:
        super().__init__()
        for key, value, low in (("batch_size", batch_size, 1), ("max_length", max_length, 2),
                                ("max_anchors", max_anchors, 1), ("min_supervised", min_supervised, 0),
                                ("num_workers", num_workers, 0)):  # fmt: skip
            checks.at_least(f"data.{key}", value, low)
        checks.probability("data.heldout_fraction", heldout_fraction)
        if isinstance(work_dir, str) and "://" not in work_dir:
            checks.path_length("data.work_dir", work_dir)
        self.mode = build("features", Component.unwrap(features))
        self.features = self.mode.stored  # what prepare writes: cached shards, or the responses alone
        resolve_feature_dtype(feature_dtype)
        self.target_config = target_config(target)
        resolve_dtype(self.target_config.dtype, "cpu")  # a typo fails here, not after the prompts are loaded
        self.sources = [Component.unwrap(s) for s in (sources if sources is not None else DEFAULT_SOURCES)]
        weighted = self.weighted  # builds every source: a bad name or setting fails here, before any work
        if isinstance(self.mode, Streamed) and weighted:
            raise UsageError("a source weight repeats samples of the map-style reader: it needs data.features: cached")
        self.heldout_fraction, self.split_seed, self.work_dir = heldout_fraction, split_seed, work_dir
        self.curation = None if curation is None else as_config(curation, Curation, "data.curation")
        self.regen = as_config(regen, RegenConfig, "data.regen")
        if self.regen.answers_per_prompt > 1 and isinstance(self.mode, Online):
            raise UsageError("data.regen.answers_per_prompt > 1 adds answers to the prepared cache: it needs "
                             "data.features: cached or streamed")  # fmt: skip
        self.max_length, self.min_supervised = max_length, min_supervised
        self.feature_dtype = feature_dtype
        self.streaming = isinstance(self.mode, Streamed)
        self.cache_url = self.mode.cache_url if self.streaming else None
        self.extra_work_dirs = self.mode.extra_work_dirs if isinstance(self.mode, Cached) else []
        self.train_samples = self.mode.train_samples if isinstance(self.mode, Cached) else None
        self.prepare_device: str | None = None  # `dspark-lightning prepare --device`; null = this rank's accelerator
        self.batch_size, self.max_anchors, self.num_workers, self.seed = batch_size, max_anchors, num_workers, seed
        self.datasets: dict[str, Any] = {}
        self.collators: dict[str, AnchorCollator] = {}
        self._prepared = False
        self._checked = False

    @property
    def weighted(self) -> bool:
        """Whether a source sets a training ``weight``."""
        return any("weight" in getattr(build_source(s), "curation", {}) for s in self.sources)

    @property
    def target(self):
        """The target for tokenisation, geometry and meta, on the CPU in its dtype: the same memoised object as the
        module's, which moves what a step reads to its device itself (all of it only for online features)."""
        return self.target_config.load()

    def _device(self) -> torch.device:
        """Where regeneration and feature extraction run: ``prepare_device``, else this rank's GPU, else the CPU."""
        if self.prepare_device is not None:
            return resolve_device(self.prepare_device)
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return torch.device("cpu")

    def _device_kind(self) -> str:
        """``cpu`` or ``cuda``: the kind of :meth:`_device`, without choosing this rank's GPU."""
        if self.prepare_device is not None:
            return resolve_device(self.prepare_device).type
        return "cuda" if torch.cuda.is_available() else "cpu"

    def prepare_job(self, progress: bool = True) -> PrepareJob:
        """The data stages of this recipe (``dspark-lightning prepare`` runs it; see ``data.prepare``).

        The target is loaded once per rank, on its device, in the dtype the model trains against
        (:meth:`~.config.TargetConfig.torch_dtype`, whatever device prepares) — and only if work is left. ``fit`` and
        ``prepare`` build this job from the same linked ``target`` (:func:`~.config.target_for_trainer`), so they
        compute the same fingerprint."""

        t = self.target_config
        target_id = {"name": t.name, "layer_ids": t.layer_ids, "system_prompt": t.system_prompt}
        if t.chat_template is not None:  # data prepared before the key existed keeps its fingerprint
            target_id["chat_template"] = t.chat_template
        target_id["dtype"] = dtype_name(t.torch_dtype())  # the data depends on it too
        regen = self._resolved_regen(self._device_kind())
        regen_dtype = regen.dtype

        return PrepareJob(
            lambda: t.load(self._device()),
            target_id,
            self.sources,
            self.work_dir,
            heldout_fraction=self.heldout_fraction,
            split_seed=self.split_seed,
            regen=regen,
            max_length=self.max_length,
            min_supervised=self.min_supervised,
            features=self.features,
            feature_dtype=self.feature_dtype,
            seed=self.seed,
            progress=progress,
            load_regen_target=None if regen_dtype is None else lambda: t.load(self._device(), regen_dtype),
            curation=self.curation,
            load_tokenizer=self._tokenizer,
        )

    def _resolved_regen(self, kind: str) -> RegenConfig:
        """``regen.dtype: fastest`` made concrete for this machine (bf16 on CUDA, on a CPU where a decode step's
        product runs faster in bf16; else the target's own precision), so the fingerprint names what ran. The CPU's
        answer is measured once per machine and kept with the kernel tables, so the fingerprint of a finished
        preparation does not change with the load of the moment."""
        if self.regen.dtype != "fastest":
            return self.regen
        from ..targets import cache_root

        faster = decode_bf16_faster(kind, cache=cache_root() / "kernels")
        return dataclasses.replace(self.regen, dtype="bf16" if faster else None)

    def _split_kwargs(self) -> dict[str, Any]:
        return {
            "heldout_fraction": self.heldout_fraction,
            "split_seed": self.split_seed,
            "max_length": self.max_length,
            "min_supervised": self.min_supervised,
            "features": self.features,
            "feature_dtype": self.feature_dtype,
            "curation": self.curation,
        }

    def _tokenizer(self) -> Any:
        """The target's tokenizer where a source filters by length in tokens (else ``None``: no target is loaded)."""
        return self.target.tokenizer if needs_tokenizer(self.sources) else None

    def _mixture(self, split: str) -> list:
        return mixture(self.sources, split, self.heldout_fraction, self.split_seed, curation=self.curation,
                       tokenizer=self._tokenizer())  # fmt: skip

    def check(self) -> None:
        """Cheap start-up validation of existing caches (sizes and member counts; ``check-cache`` hashes the shards).
        Runs once per process, first thing in :meth:`prepare_data` (before any data is made) and :meth:`setup` (the
        ranks Lightning does not prepare data on)."""
        self._checked = True
        if self.features == "cached" and self.cache_url is None:
            paths = DataPaths(Path(self.work_dir))
            if self._holds_other_data(paths):  # a changed recipe: prepare_data makes its data again, beside it
                print(f"[dspark-lightning] {self.work_dir} holds the data of another configuration of the recipe "
                      "(target, layers or data settings changed): preparing it again", flush=True)  # fmt: skip
            else:
                check_caches(self.target, paths, self.feature_dtype)
        for extra in self.extra_work_dirs:
            paths = DataPaths(Path(extra))
            if not all(paths.cache(split).is_dir() for split in ("train", "heldout")):
                raise CacheError(
                    f"data.features.extra_work_dirs: {extra} has no prepared feature caches (features_train/ and "
                    "features_heldout/); run `dspark-lightning prepare` with its recipe first"
                )
            check_caches(self.target, paths, self.feature_dtype)

    def _holds_other_data(self, paths: DataPaths) -> bool:
        """Whether the work dir's finished data (``prepared.json``) was made for another fingerprint."""
        try:
            done = json.loads(paths.prepared.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(done, dict) and done.get("fingerprint") != self.prepare_job(progress=False).fingerprint

    def prepare_data(self) -> None:
        """Reuse a finished ``prepare``; without one, do the work here on a CPU-only machine (local rank 0, as
        Lightning calls it), and refuse on a machine with an accelerator, where ``prepare`` shards it over GPUs."""
        if not self._checked:
            self.check()
        if self._prepared or self.cache_url is not None:  # validate-before-fit and fit both call this
            return
        self._prepared = True
        job = self.prepare_job()
        if job.is_done():
            print(f"[dspark-lightning] reusing prepared data in {self.work_dir} ({job.fingerprint})", flush=True)
            return
        if torch.cuda.is_available():
            raise CacheError(
                f"{self.work_dir} holds no finished data for this recipe (no matching prepared.json); run "
                "`dspark-lightning prepare --config <recipe>` first (torchrun / one process per GPU shards it): "
                "fit does not regenerate or extract features on a machine with an accelerator"
            )
        job.run(rank=0, world_size=1)
        self.report_roofline()

    def report_roofline(self) -> list[dict]:
        """Print each data stage's tokens/s against this machine's roof and store the table in
        ``prepare_stats.json`` (``roofline``): the matrix-product throughput in the stage's dtype and the read
        bandwidth of this machine, measured once per machine and cached
        (:func:`~dspark_lightning.infer.profiling.roofline.machine_roofs`; the table:
        :func:`~dspark_lightning.infer.profiling.roofline.stage_roofline`).
        Timings are of the run that did the work; on another machine than the one that prepared, the roofs differ."""
        from ..atomic import atomic_write
        from ..devices import cpu_model
        from ..infer.profiling import roofline as rf

        path = DataPaths(Path(self.work_dir)).stats
        try:
            stats = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        device = torch.device(self._device())
        target = self.target
        regen = self._resolved_regen(device.type)
        regen_dtype = resolve_dtype(regen.dtype, device) if regen.dtype is not None else target.dtype
        dtypes = {target.dtype, regen_dtype}
        flops, bandwidth = rf.machine_roofs(device, dtypes)  # measured once per machine, then cached
        rows = rf.stage_roofline(target, stats, flops, bandwidth, regen_dtype, regen.concurrency)
        if rows:
            print("[dspark-lightning] " + rf.stage_text(rows, flops, bandwidth), flush=True)
            stats["roofline"] = {"device": cpu_model() if device.type == "cpu" else str(device), "rows": rows,
                                 "matmul_gflop_s": {k: round(v / 1e9, 1) for k, v in flops.items()},
                                 "read_gb_s": round(bandwidth / 1e9, 2)}  # fmt: skip
            atomic_write(path, json.dumps(stats, indent=2) + "\n")
        return rows

    def setup(self, stage: str | None = None) -> None:
        if not self._checked:
            self.check()
        for split in ("train", "heldout"):
            if split not in self.datasets:
                self.datasets[split] = self._stream(split) if self.streaming else self._open(split)

    def _open(self, split: str):
        own = open_split(self.target, self.sources, self.work_dir, split, **self._split_kwargs())
        if split == "train":
            own = self._weighted(self._kept(own))
        if not self.extra_work_dirs:
            return own
        meta = expected_meta(self.target, self.feature_dtype)
        extra = [FeatureCache(DataPaths(Path(d)).cache(split), expect=meta) for d in self.extra_work_dirs]
        return ConcatDataset([own, *extra])

    def _kept(self, dataset: FeatureCache) -> Any:
        """The training cache cut to ``train_samples`` conversations (every answer of a kept prompt stays)."""
        if self.train_samples is None:
            return dataset
        ids = dataset.sample_ids()
        keep = first_prompts(ids, self.train_samples, self.seed)
        print(f"[dspark-lightning] train_samples: {len(keep)} of {len(set(map(prompt_of, ids)))} training "
              "conversations", flush=True)  # fmt: skip
        return Subset(dataset, [i for i, x in enumerate(ids) if prompt_of(x) in keep])

    def _weighted(self, dataset: Any) -> Any:
        """The training set with each source's ``weight`` applied: a sample of a weight-w source appears floor(w)
        times, plus once more for a fixed fraction frac(w) of them (chosen by id hash), so an epoch sees the mixture
        in those proportions."""
        if not self.weighted:
            return dataset
        weights = curated_mixture(self.sources, self.curation, self._tokenizer(), self.split_seed).weights
        ids = dataset.sample_ids() if isinstance(dataset, FeatureCache) else [r["id"] for r in dataset]
        index = repeat_index(ids, weights, self.seed)
        print(f"[dspark-lightning] source weights: {len(ids)} training conversations -> {len(index)} per epoch",
              flush=True)  # fmt: skip
        return Subset(dataset, index)

    def _stream(self, split: str) -> ShardStream:
        """This rank's share of a split's shards; training streams are shuffled and cut even across ranks."""
        trainer = getattr(self, "trainer", None)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        root = (self.cache_url or self.work_dir).rstrip("/")
        train = split == "train"
        return ShardStream(
            f"{root}/features_{split}",
            expect=expected_meta(self.target, self.feature_dtype),
            rank=rank,
            world_size=world,
            shuffle=train,
            shuffle_buffer=self.mode.shuffle_buffer if train else 0,
            seed=self.seed,
            even=train and world > 1,
        )

    def token_counts(self, split: str = "train"):
        """Occurrences (V,) of each target token in the split's regenerated responses (supervised tokens only)."""
        ids = {p.id for p in self._mixture(split)}
        if split == "train" and self.train_samples is not None:
            cached = FeatureCache(DataPaths(Path(self.work_dir)).cache("train")).sample_ids()
            ids &= first_prompts(cached, self.train_samples, self.seed)
        tgt = self.target
        rows = tokenized_split(tgt, DataPaths(Path(self.work_dir)), split, ids, self.max_length, self.min_supervised)
        for extra in self.extra_work_dirs:  # every conversation an extra work dir prepared for this split
            paths = DataPaths(Path(extra))
            extra_ids = {r["id"] for r in load_conversations(paths.responses(split))}
            rows += tokenized_split(tgt, paths, split, extra_ids, self.max_length, self.min_supervised)
        return response_token_counts(rows, tgt.geometry.vocab_size)

    def set_epoch(self, epoch: int) -> None:
        """Re-seed training anchors per epoch (called by the module at each epoch start)."""
        if "train" in self.collators:
            self.collators["train"].epoch = epoch
        if isinstance(self.datasets.get("train"), ShardStream):
            self.datasets["train"].set_epoch(epoch)

    def _pin_memory(self) -> bool:
        """Pin the batches (page-locked host memory) when the trainer computes on CUDA: the copy to the GPU is then a
        DMA that runs asynchronously (Lightning moves batches with ``non_blocking=True``), instead of a staged, blocking
        copy of every batch's bf16 features. Never on the CPU, where pinning is a wasted copy."""
        trainer = getattr(self, "trainer", None)
        return trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        pad = self.target.tokenizer.pad_token_id or 0
        self.collators[split] = AnchorCollator(self.max_anchors, seed=self.seed, pad_id=pad)
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size,
            shuffle=shuffle and not isinstance(self.datasets[split], ShardStream),  # a stream shuffles itself
            collate_fn=self.collators[split],
            num_workers=self.num_workers,
            pin_memory=self._pin_memory(),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("heldout", False)  # epoch 0 anchors always: comparable numbers across epochs

    test_dataloader = val_dataloader
