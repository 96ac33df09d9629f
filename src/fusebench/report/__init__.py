"""Outputs: a run's files (``outputs``), the printed table (``table``), plots (``plots``, drawn in the background
during sweeps by ``background``), sweep reports (``sweep``, ``runs``, ``fusebench-report`` in ``cli``), the article's
reported numbers beside a run's own (``article``) and notebook helpers (``notebook``)."""
