"""Outputs: a run's files (``outputs``), the printed table (``table``), the plots (``plots/``: one module per plot,
registered), sweep reports (``sweep``, ``sweep_markdown``, ``scaling``, ``index_effects``, over run dirs read by
``runs``; ``fusebench-report`` in ``cli``; the files a report may replace in ``report_files``), what a report calls a
retriever and a corpus (``retrievers``, ``labels``), the article's reported numbers beside a run's own
(``article``) and notebook helpers (``notebook``, ``frames``).
"""
