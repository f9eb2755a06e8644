"""Data pipeline: prompt sources, response regeneration, target features and their cache, anchors, DataModule."""
