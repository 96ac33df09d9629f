"""The application around the math: the ``fusebench``, ``fusebench-models`` and ``fusebench-cache`` commands
(``cli``, ``cache_cli``), one run's orchestration (``pipeline``: config -> corpus -> embeddings -> lists -> fusion ->
metrics -> files; ``retrieval``: every retriever's lists from the stores and fusion), the Hydra callback and run-dir
checks (``callback``, ``rundir``), W&B logging (``tracking``), progress bars and Ctrl-C handling."""
