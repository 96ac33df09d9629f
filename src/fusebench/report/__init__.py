"""Outputs: a run's files (``outputs``), the printed table (``table``), plots (``plots``), sweep reports (``sweep``,
``runs``, ``fusebench-report`` in ``cli``), the article's reported numbers beside a run's own (``article``) and
notebook helpers (``notebook``)."""
