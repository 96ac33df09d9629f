"""Embedding sources behind one entry point, light to import (the config check scans ``kinds`` before any
heavy import).

Each model spec (one ``conf/models/*.yaml`` or ``+models.NAME.*`` overrides) has a ``kind``, one module of
``kinds`` (its name, spec class with the keys and their checks, and its operation; the registry:
``kinds.REGISTRY``): ``sim`` (simulated), ``vectors`` (embeddings the user already has) and the real kinds,
embedded through the embedding cache (``real``) by a backend implementing ``base.Encoder`` (``openclip``, ``hf``,
``sentence_transformers``). ``models.load_raw`` gets a model's rows by its kind; ``models.finalize`` validates
and L2-normalises them once every model is loaded. Besides: text preprocessing (``query_text``), image decoding
(``images``), gallery shards (``shards``, ``distractors``, ``vector_dumps``, ``duplicate_scan``) and the cache
keys' fingerprints (``fingerprint``).
"""
