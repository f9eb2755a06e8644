"""How training reads the target's features (``data.features``): a mode carries only the settings it uses, so a
combination that cannot work cannot be written.

    features: cached                                                        # prepare writes shards; read map-style
    features: {class_path: cached, init_args: {train_samples: 1150}}        # a fixed subset of the prepared data
    features: {class_path: streamed, init_args: {cache_url: s3://b/run}}    # the same shards, streamed per rank
    features: online                                                        # the target runs in the training step
"""

from __future__ import annotations

from ...checks import at_least, path_length
from ...registry import register


class FeatureMode:
    """Base of the modes; ``stored``: what ``prepare`` writes for it (``cached`` shards, or nothing but the
    responses for ``online``), part of the data's fingerprint."""

    stored = "cached"


@register("features", "online")
class Online(FeatureMode):
    """The frozen target runs inside every training step: nothing cached, each epoch pays the target's forward."""

    stored = "online"


@register("features", "cached")
class Cached(FeatureMode):
    """``prepare`` writes the features once (webdataset shards); training reads them map-style (shuffled per epoch,
    source weights applied).

    Args:
        extra_work_dirs: other prepared work dirs (``dspark-lightning prepare`` of another recipe with the same target,
            layers and feature dtype) whose cached splits are trained and validated on with this one, e.g. regenerated
            data plus fixed text. Read, never prepared: a missing or mismatched cache fails at start-up. Their
            responses count towards the draft vocabulary.
        train_samples: train on this many of the prepared training conversations only (null = all): the first in a
            fixed order (a hash of ``data.seed`` and the prompt id), so a smaller count is a subset of a larger one and
            one preparation serves every arm of a data-size curve (``dspark-lightning data-curve``). The draft
            vocabulary counts the kept conversations only.
    """

    def __init__(self, extra_work_dirs: list[str] | None = None, train_samples: int | None = None) -> None:
        self.extra_work_dirs = [str(d) for d in extra_work_dirs or []]
        for d in self.extra_work_dirs:
            path_length("data.features.extra_work_dirs", d)
        at_least("data.features.train_samples", train_samples, 1)
        self.train_samples = train_samples


@register("features", "streamed")
class Streamed(FeatureMode):
    """The cache ``prepare`` writes, read by the streaming
    :class:`~dspark_lightning.data.features.stream.ShardStream`: shards split by rank and DataLoader worker, features
    kept in bf16 until the device.

    Args:
        cache_url: where the reader finds ``features_<split>/`` (a directory or fsspec URL such as
            ``s3://bucket/run/data``; null = ``data.work_dir``). A cache read from a URL is used as it is.
        shuffle_buffer: samples each worker holds for shuffling (memory: buffer x S x (n+1) x d x 2 B).
    """

    def __init__(self, cache_url: str | None = None, shuffle_buffer: int = 16) -> None:
        at_least("data.features.shuffle_buffer", shuffle_buffer, 1)
        self.cache_url, self.shuffle_buffer = cache_url, shuffle_buffer
