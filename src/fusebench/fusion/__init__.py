"""Fusion of several models' ranked lists into one: the ``fusion`` config group as a type (``config``, light:
no torch), fusion over top-k lists (``combine``), the per-list normalisers that turn a list into evidence
(``normalisers``: RRF, ISR, Borda, min-max, z-score, DBSF, ...), fusion over whole rankings in bounded memory
(``whole_rankings``, ``fusion.top_k: null``) and the engine presets' labels (``presets``; the presets themselves
are ``conf/fusion/*.yaml``). A new method is a normaliser in ``normalisers`` (or an aggregation in ``combine``),
its name in ``config``, plus a ``conf/fusion/NAME.yaml``."""
