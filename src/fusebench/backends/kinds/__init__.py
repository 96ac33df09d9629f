"""The search backends, one module each (``search.backend``), found by a scan of this package
(:data:`fusebench.backends.base.REGISTRY`). A module registers one :class:`~fusebench.backends.base.Backend`: its
name and order, the indexes it builds, the shared settings it reads, a dataclass of the ``search.*`` settings only
it reads (added flat to ``SearchConfig``), its own rules (``check``) and its run. Light on purpose: a module's top
level imports no numpy, torch, faiss or engine package (the CLI scans this package to check a config), and never
``SearchConfig`` itself (assembled from this scan: annotations only). An engine's run is its own
``run(request) -> EngineLists`` inside :mod:`fusebench.backends.engine_steps`' steps."""
