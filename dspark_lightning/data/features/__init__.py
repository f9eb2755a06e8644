"""Features: tokenised conversations and the target's features for them (``extract.py``: online and batched), the
feature cache (``cache.py``) and its streaming reader (``stream.py``), anchor sampling and batch collation
(``anchors.py``) and the draft-vocabulary selection (``vocab.py``)."""
