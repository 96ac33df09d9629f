"""The bottom layer: what every stage may use without importing the layers above it. ``state`` (what one process
keeps from one job to the next), ``progress`` (tqdm bars that stay quiet in logs), ``checks`` (typed reads of config
values that name the key and what is valid), ``plugins`` (the one ``Registry`` every extension point fills by a
package scan), ``layout`` (the names of what a run writes into its dir; the plots' registry), ``run_lock`` (one run
per run dir), ``arguments`` (argparse for the small commands), ``jit`` and ``numba_internals`` (the numba kernels'
compilation and disk cache). Nothing here imports any other fusebench package.
"""
