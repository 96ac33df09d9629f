"""Search backends: who answers each model's queries, behind one interface (:mod:`.base`: a :class:`~.base.Backend`
each module of :mod:`.kinds` registers, and the registry every table about backends is derived from).

* :mod:`.kinds.exact` (the default): brute force in torch, exact ranks (:mod:`.retrieval`: each model's lists from
  the list store or computed once, then the run's fusion over them);
* :mod:`.kinds.faiss`: a FAISS index per model and direction (:mod:`.faiss_index`, stored beside the list store),
  fused by fusebench, with the index's neighbour recall against exact lists (:mod:`.quality`);
* :mod:`.kinds.milvus`, :mod:`.kinds.lancedb`, :mod:`.kinds.qdrant`: the engine itself, embedded (Milvus Lite,
  LanceDB, Qdrant's local mode), answering with its own hybrid search and its own fusion of a preset; what they
  share is :mod:`.engine_steps`, and their databases' folders in the run dir :mod:`.engine_dirs`.

The machinery the backends share stays here beside :mod:`.kinds`, which holds only the backends, one module each.
"""

# The search schema first: it is assembled from a scan of .kinds (every backend's params), so a backend module
# imported by name (tests, the API) is imported by that scan, whole, before anything reads the schema.
from fusebench.config import search as _search  # noqa: F401
