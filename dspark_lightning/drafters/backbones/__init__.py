from .base import DecoderLayer, InjectedBackbone, per_layer_masks
from .dense import DenseBackbone
from .moe_swa import MoESWABackbone

__all__ = ["DecoderLayer", "DenseBackbone", "InjectedBackbone", "MoESWABackbone", "per_layer_masks"]
