"""Decoding for language models: continuous batching of one model's sequences.

:mod:`.batching` holds the loop (sequences join and leave between steps, KV caches held in
the ledger), :mod:`.batch_step` one engine pass for every sequence in flight, and
:mod:`.sampling` how one sequence picks its next token.
"""
