"""Run outputs: files in the run dir and the printed table."""
