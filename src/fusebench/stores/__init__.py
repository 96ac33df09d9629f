"""What is computed once and reused by every later run: content-addressed entries (key over every input that
changes the result, meta.json naming the inputs, a lock, checksums, atomic writes, rebuilt when corrupt), for
embeddings (``embeddings``: the ``EmbeddingCache`` and the entry mechanism every store shares), each model's ranked
lists (``lists``) and whole score matrices (``scores``). ``files`` holds atomic writes, digests and checksums."""
