"""The target's verification: one batched target forward per round and the KV caches it keeps
(:class:`~dspark_lightning.infer.protocols.Verifier`).

- ``hf.py``: the ``hf`` verifier (the HF model's own forward) and ``build_verifier`` (``auto``: ``lean`` or ``hf``);
- ``lean.py``: the ``lean`` verifier, a lean re-implementation of the Llama-family forward;
- ``kernels.py``: the matrix kernels chosen per machine that the lean forward (and the draft LM head) run through;
- ``kvcache.py``: the ragged per-request KV cache with rollback, the target's and the drafter context cache's, and
  its per-request bookkeeping (``RequestCache``).
"""
