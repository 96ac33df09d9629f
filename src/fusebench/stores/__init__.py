"""What is computed once and reused by every later run. One entry mechanism (``entries``: content key over every
input that changes the result, meta.json naming the inputs, a lock, checksums, discard when corrupt, scan for
``fusebench-cache``) under every store: embeddings (``embeddings``: the ``EmbeddingCache``), each model's ranked
lists (``lists``) and whole score matrices (``scores``). ``files`` holds atomic writes, digests and checksums."""
