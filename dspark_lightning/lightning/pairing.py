"""The one check that a drafter module and the data it trains on describe the same target features.

A drafter learns from the hidden states of specific target layers, under a specific chat format, tokenizer and
precision; its export records the module's settings, and serving feeds it what the export says. If the data was made
with other settings (another tap list, system prompt, target or dtype), training still runs and the drafter is
silently misaligned: high training acceptance, low serving acceptance. :func:`check_pairing` compares the two sides
and refuses in one message naming each difference. ``DSparkModule.setup`` calls it, so every route goes through it:
``dspark-lightning fit``, a plain ``Trainer.fit(module, datamodule)``, a resumed fit and extra work dirs (whose caches
the datamodule checks against its own target). A recipe declares its target once, so this fires for modules and data
built apart (from Python, or a checkpoint's module with another recipe's data).
"""

from __future__ import annotations

from typing import Any

from ..checks import UsageError


class PairingError(UsageError):
    """The module and its data were built for different target features."""


def features_of(target: Any) -> dict[str, Any]:
    """What a drafter's inputs depend on: the target, its tapped layers, the chat format and the target's dtype."""
    g = target.geometry
    p = next(target.model.parameters())
    return {
        "target": str(target.name),
        "layer_ids": [int(i) for i in g.layer_ids],
        "hidden_size": int(g.hidden_size),
        "vocab_size": int(g.vocab_size),
        "chat format": target.chat.to_dict(),
        "target dtype": str(p.dtype).removeprefix("torch."),
    }


def check_pairing(module_target: Any, data_target: Any) -> None:
    """Refuse a module whose target features differ from its datamodule's (every difference, one message)."""
    mine, theirs = features_of(module_target), features_of(data_target)
    diffs = [k for k in mine if mine[k] != theirs[k]]
    if not diffs:
        return
    parts = "; ".join(f"{k}: model {mine[k]!r}, data {theirs[k]!r}" for k in diffs)
    raise PairingError(
        f"the drafter module and its data describe different target features, so the drafter would learn from "
        f"inputs it will not see when served: {parts}; give both the same target section (TargetConfig)"
    )
