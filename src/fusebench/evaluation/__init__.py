"""Evaluation, pure functions over per-query ranks: recall@k and median rank (``metrics``), paired bootstrap and
tests (``stats``), per-retriever results and paired comparisons (``comparisons``), extra positives for COCO
(``positives``), honest tuning on a held-out split (``tuning``), and the run record they fill (``record``,
what metrics.json serialises). A new statistic goes in ``stats`` and is reported through ``comparisons``."""
