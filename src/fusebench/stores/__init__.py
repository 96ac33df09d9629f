"""What is computed once and reused by every later run. One entry mechanism (``entries``: content key over every
input that changes the result, meta.json naming the inputs, a lock, checksums, discard when corrupt, scan for
``fusebench-cache``) under every store: embeddings (``embeddings``: the ``EmbeddingCache``), and on its base ``Store``
each model's ranked lists (``lists``), whole score matrices (``scores``), distractors' near-duplicate maxima
(``near_duplicates``) and FAISS indexes (``indexes``). ``files`` holds atomic writes, digests and checksums."""
