"""Regeneration: the target answers every prompt's user turns (``regenerate.py``: our engine or HF ``generate``;
``regen_server.py``: an OpenAI-compatible chat server), written as resumable JSONL."""
