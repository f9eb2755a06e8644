"""Inference runtime: lossless, batched, scheduled speculative decoding. Never imports lightning.

from dspark_lightning.infer import decode
"""

from .acceptance.accept import Acceptance, accept
from .acceptance.sampling import SamplingParams, probs, sample
from .decode import DecodeResult, decode, encode_prompt
from .engine import Engine
from .hardware import HardwareProfile
from .profiling.measure_hardware import measure_hardware
from .profiling.measure_sps import load_or_profile, profile_sps
from .propose.draft import BlockProposer, Proposal, make_proposer
from .propose.proposer import ProposerBase, StatelessProposer
from .protocols import Proposer, Verifier
from .request import Request
from .schedule.schedulers import (
    AsyncHardwareAwareScheduler,
    AutoScheduler,
    HardwareAwareScheduler,
    Scheduler,
    StaticScheduler,
    ThresholdScheduler,
    build_scheduler,
    prefix_schedule,
)
from .schedule.sps import SPSTable
from .stats import DecodeStats, RoundLog, summarize
from .verify.hf import HFVerifier, build_verifier
from .verify.lean import LeanVerifier

__all__ = [
    "Acceptance",
    "AsyncHardwareAwareScheduler",
    "AutoScheduler",
    "BlockProposer",
    "DecodeResult",
    "DecodeStats",
    "Engine",
    "HFVerifier",
    "HardwareAwareScheduler",
    "HardwareProfile",
    "LeanVerifier",
    "Proposal",
    "Proposer",
    "ProposerBase",
    "Request",
    "RoundLog",
    "SPSTable",
    "SamplingParams",
    "Scheduler",
    "StatelessProposer",
    "StaticScheduler",
    "ThresholdScheduler",
    "Verifier",
    "accept",
    "build_scheduler",
    "build_verifier",
    "decode",
    "encode_prompt",
    "load_or_profile",
    "make_proposer",
    "measure_hardware",
    "prefix_schedule",
    "probs",
    "profile_sps",
    "sample",
    "summarize",
]
