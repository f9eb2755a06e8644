"""DSparkDataModule: Lightning glue over the Lightning-free stages in ``dspark_lightning.data``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from ..data.anchors import AnchorCollator
from ..data.features import resolve_feature_dtype
from ..data.prepare import DataPaths, RegenConfig, check_caches, open_split, prepare, tokenized_split
from ..data.sources import build_source, mixture
from ..data.vocab import response_token_counts
from ..targets import ChatFormat, load_target

DEFAULT_SOURCES = [{"name": "gsm_symbolic", "limit": 64}, {"name": "humaneval", "limit": 64}, {"name": "mtbench"}]


class DSparkDataModule(L.LightningDataModule):
    """Prompts -> target-regenerated responses -> target features -> anchor-packed batches.

    Args:
        target: embedded target name (``smollm2-135m-instruct``, ``tiny-debug``) or HF model path.
        layer_ids: tapped target layers (null = the SPEC §3.2 rule).
        system_prompt: system prompt of the shared chat format (null = the template's default).
        sources: registered prompt sources, each ``{name: ..., <its args>}`` (see ``dspark_lightning.data.sources``).
        heldout_fraction: fraction of prompts held out for validation / evaluation / calibration.
        split_seed: seed of the hash-based train / held-out split.
        work_dir: where responses, feature caches and prepare_stats.json go.
        regen: response regeneration settings.
        max_length: truncate conversations to this many tokens.
        min_supervised: drop conversations with fewer supervised (response) tokens.
        features: ``cached`` (webdataset shards, written once) or ``online`` (target forward in the training step).
        feature_dtype: storage precision of features, the same for both paths.
        batch_size: sequences per micro-batch.
        max_anchors: anchors sampled per sequence (SPEC: up to 512).
        num_workers: DataLoader workers.
        seed: seed of regeneration sampling and anchor sampling.
    """

    def __init__(
        self,
        target: str = "tiny-debug",
        layer_ids: list[int] | None = None,
        system_prompt: str | None = None,
        sources: list[dict[str, Any]] | None = None,
        heldout_fraction: float = 0.05,
        split_seed: int = 42,
        work_dir: str = "outputs/data",
        regen: RegenConfig | None = None,
        max_length: int = 1024,
        min_supervised: int = 14,
        features: str = "cached",
        feature_dtype: str = "bfloat16",
        batch_size: int = 4,
        max_anchors: int = 64,
        num_workers: int = 0,
        seed: int = 42,
    ) -> None:
        super().__init__()
        if features not in ("cached", "online"):
            raise ValueError(f"data.features must be 'cached' or 'online', got {features!r}")
        resolve_feature_dtype(feature_dtype)
        self.target_name, self.layer_ids, self.system_prompt = target, layer_ids, system_prompt
        self.sources = list(sources if sources is not None else DEFAULT_SOURCES)
        for spec in self.sources:  # unknown source names / arguments fail here, before any expensive work
            build_source(spec)
        self.heldout_fraction, self.split_seed, self.work_dir = heldout_fraction, split_seed, work_dir
        self.regen = regen or RegenConfig()
        self.max_length, self.min_supervised = max_length, min_supervised
        self.features, self.feature_dtype = features, feature_dtype
        self.batch_size, self.max_anchors, self.num_workers, self.seed = batch_size, max_anchors, num_workers, seed
        self.datasets: dict[str, Any] = {}
        self.collators: dict[str, AnchorCollator] = {}
        self._prepared = False

    @property
    def target(self):
        return load_target(
            self.target_name, layer_ids=self.layer_ids, chat=ChatFormat(system_prompt=self.system_prompt)
        )

    def _split_kwargs(self) -> dict[str, Any]:
        return {
            "heldout_fraction": self.heldout_fraction,
            "split_seed": self.split_seed,
            "max_length": self.max_length,
            "min_supervised": self.min_supervised,
            "features": self.features,
            "feature_dtype": self.feature_dtype,
        }

    def check(self) -> None:
        """Cheap start-up validation of existing caches (a corrupt shard fails before any expensive work)."""
        if self.features == "cached":
            check_caches(self.target, DataPaths(Path(self.work_dir)), self.feature_dtype)

    def prepare_data(self) -> None:
        if self._prepared:  # validate-before-fit and fit both call this
            return
        self._prepared = True
        prepare(self.target, self.sources, self.work_dir, regen=self.regen, seed=self.seed, **self._split_kwargs())

    def setup(self, stage: str | None = None) -> None:
        for split in ("train", "heldout"):
            if split not in self.datasets:
                self.datasets[split] = open_split(
                    self.target, self.sources, self.work_dir, split, **self._split_kwargs()
                )

    def token_counts(self, split: str = "train"):
        """Occurrences (V,) of each target token in the split's regenerated responses (supervised tokens only)."""
        ids = {p.id for p in mixture(self.sources, split, self.heldout_fraction, self.split_seed)}
        tgt = self.target
        rows = tokenized_split(tgt, DataPaths(Path(self.work_dir)), split, ids, self.max_length, self.min_supervised)
        return response_token_counts(rows, tgt.geometry.vocab_size)

    def set_epoch(self, epoch: int) -> None:
        """Re-seed training anchors per epoch (called by the module at each epoch start)."""
        if "train" in self.collators:
            self.collators["train"].epoch = epoch

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        pad = self.target.tokenizer.pad_token_id or 0
        self.collators[split] = AnchorCollator(self.max_anchors, seed=self.seed, pad_id=pad)
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            collate_fn=self.collators[split],
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("heldout", False)  # epoch 0 anchors always: comparable numbers across epochs

    test_dataloader = val_dataloader
