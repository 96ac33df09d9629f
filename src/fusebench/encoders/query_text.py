"""Query text preprocessing: the per-model choices that change what the text tower sees.

``case``: ``as_typed`` (unchanged), ``lowercase``, or ``canonicalize`` (open_clip's clean: lowercase, strip
punctuation, collapse whitespace). ``template``: an optional prompt with one ``{}`` for the caption.
The settings are a spec's ``text`` (:class:`fusebench.config.specs.TextConfig`, checked there); the tokenizer's
padding and length are the backend's business (see hf.py / openclip.py).
"""

from __future__ import annotations

from fusebench import FusebenchError
from fusebench.config.specs import TEXT_CASES


def preprocess_text(text: str, case: str, template: str | None) -> str:
    if case == "lowercase":
        text = text.lower()
    elif case == "canonicalize":
        from open_clip.tokenizer import canonicalize_text

        text = canonicalize_text(text)
    elif case != "as_typed":
        raise FusebenchError(f"text case {case!r} is not valid; valid: {', '.join(TEXT_CASES)}.")
    return template.format(text) if template else text


def preprocess_texts(texts: list[str], case: str, template: str | None) -> list[str]:
    return [preprocess_text(t, case, template) for t in texts]
