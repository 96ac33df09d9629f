"""Vector databases in the loop, embedded: Milvus Lite, LanceDB and Qdrant's local mode answer the run's queries with
their own indexes and their own fusion (``search=milvus | lancedb | qdrant``). :mod:`.base` is the one interface;
each engine module loads the cached embeddings into its engine and returns the lists it gets back."""
