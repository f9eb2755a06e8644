"""Data pipeline, one subpackage per stage of data preparation:

- :mod:`.prompts`: where prompts come from (built-in sources, corpora and the users' own files, chat-format readers,
  evaluation sets, prompts the target writes itself, fixed text) and what a training mixture keeps of them
  (curation, decontamination, weights);
- :mod:`.regen`: the target's responses to those prompts (our engine, HF ``generate``, an OpenAI-compatible server);
- :mod:`.features`: tokenised conversations turned into the target's features, their cache and its streaming reader,
  anchor sampling and the draft vocabulary.

``prepare.py`` stays at this level: it runs all three stages in order (sharded over ranks, fingerprinted, resumable)
and is what ``dspark-lightning prepare`` and the DataModule call, so it belongs to no single stage.
"""
