from .dense import DecoderLayer, DenseBackbone

__all__ = ["DecoderLayer", "DenseBackbone"]
