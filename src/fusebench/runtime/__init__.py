"""The bottom layer: what every stage may use without importing the layers above it. ``state`` (what one process
keeps from one job to the next), ``progress`` (tqdm bars that stay quiet in logs) and ``layout`` (the names of
what a run writes into its dir). Nothing here imports any other fusebench package."""
