"""The application around the library: the commands (``cli``: ``fusebench`` and ``fusebench-models``;
``cache_cli``: ``fusebench-cache``; ``embed_cli``: ``fusebench-embed``), the Python API (``api``), a composed config
made one typed ``RunConfig`` (``run_config``), one run as named stages (``pipeline``, with ``tune_stage``,
``gallery_stage`` and ``index_tuning``), the Hydra callback and run and sweep dirs (``callback``, ``rundir``), W&B
(``tracking``, ``wandb_files``) and Ctrl-C (``interrupts``). Nothing below this package imports it.
"""
