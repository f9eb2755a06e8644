"""Acceptance: the laws drafts and targets sample from, their random streams, and how a block's prefix is accepted
(:class:`~dspark_lightning.infer.protocols.AcceptanceMode`).

- ``sampling.py``: sampling laws shared by the draft and the target, and the per-request random streams;
- ``accept.py``: lossless rejection-sampling acceptance (``accept``, ``RejectionAcceptance``, ``Acceptance``);
- ``coupled.py``: coupled acceptance, the drafter and the target sharing one Gumbel noise.

(Named ``acceptance``, not ``accept``: ``dspark_lightning.infer.accept`` is the public acceptance function.)
"""
