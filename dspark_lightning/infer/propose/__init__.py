"""Where drafts are made: the drafter's runtime side (:class:`~dspark_lightning.infer.protocols.Proposer`).

- ``proposer.py``: the bases of the proposers (``ProposerBase``: the drafter context cache's per-request bookkeeping
  and the draft-vocabulary mapping; ``StatelessProposer``: no cache);
- ``draft.py``: the block proposer of the parallel drafters (DSpark, DFlash), ``Proposal``, ``make_proposer``;
- ``chain.py``: the proposer of the chain drafters (EAGLE-3, MTP-k);
- ``backlog.py``: the target features of steps the drafter skipped, held until it drafts again.
"""
