"""Fusion of several models' ranked lists into one: the ``fusion`` config group as a type (``config``, light:
no torch), the methods that turn a list into evidence (``methods``: one module each, registered), fusion over
top-k lists (``combine``), what the methods share (``normalisers``), fusion over whole rankings in bounded memory
(``whole_rankings``, ``fusion.top_k: null``) and the engine presets' labels (``presets``; the presets themselves
are ``conf/fusion/*.yaml``). A new method is one module in ``methods`` plus a ``conf/fusion/NAME.yaml``."""
