from .confidence import ConfidenceHead
from .sequential import GatedMarkovHead, LowRank, RNNHead, SeqHead, VanillaMarkovHead

__all__ = ["ConfidenceHead", "GatedMarkovHead", "LowRank", "RNNHead", "SeqHead", "VanillaMarkovHead"]
