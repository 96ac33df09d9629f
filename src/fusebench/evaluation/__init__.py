"""Evaluation, pure functions over per-query ranks: recall@k and median rank (``metrics``), paired bootstrap and
tests (``stats``), per-retriever results and paired comparisons (``comparisons``), extra positives for COCO
(``positives``), honest tuning on a held-out split (``tuning``), the distractor-scaling study's predictions
(``extrapolation``), and the run record they fill (``record``, ``subrecords``, ``search_record``, what metrics.json
serialises; ``record_versions``: older records read as today's). ``parity`` compares an engine's fused lists with
the exact preset. A new statistic goes in ``stats`` and is reported through ``comparisons``.
"""
