"""Prompts: the registered prompt sources (``prompt_source``: built-in sets in ``sources.py``, real text and the
users' own files in ``corpora.py``, prompts that carry their responses in ``fixed_text.py``, prompts the target
writes in ``self_prompts.py``), readers of conversation files in the formats users have (``formats.py``),
evaluation and calibration sets (``evalsets.py``), curation and decontamination (``curate.py``) and the training
mixture (``mixture.py``).
``builtin/`` holds the prompt files shipped in the package."""
