"""Search backends: who answers each model's queries, behind one interface (:mod:`.base`: a :class:`~.base.Backend`
each module registers, and the registry every table about backends is derived from).

* :mod:`.exact` (the default): brute force in torch, exact ranks (:mod:`.retrieval`: each model's lists from the
  list store or computed once, then the run's fusion over them);
* :mod:`.faiss`: a FAISS index per model and direction (:mod:`.faiss_index`, stored beside the list store), fused by
  fusebench, with the index's neighbour recall against exact lists (:mod:`.quality`);
* :mod:`.milvus`, :mod:`.lancedb`, :mod:`.qdrant`: the engine itself, embedded (Milvus Lite, LanceDB, Qdrant's local
  mode), answering with its own hybrid search and its own fusion of a preset; what they share is
  :mod:`.engine_steps`, and their databases' folders in the run dir :mod:`.engine_dirs`.
"""
