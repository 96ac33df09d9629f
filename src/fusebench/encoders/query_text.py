"""Query text preprocessing: the per-model choices that change what the text tower sees.

``case``: ``as_typed`` (unchanged), ``lowercase``, or ``canonicalize`` (open_clip's clean: lowercase, strip
punctuation, collapse whitespace). ``template``: an optional prompt with one ``{}`` for the caption.
The tokenizer's padding and length are the backend's business (see hf.py / openclip.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from fusebench import FusebenchError

TEXT_CASES = ("as_typed", "lowercase", "canonicalize")


def text_settings(name: str, spec: Mapping) -> dict:
    """The model's text preprocessing choices, validated, with defaults filled in."""
    text = dict(spec.get("text") or {})
    case = text.get("case", "as_typed")
    if case not in TEXT_CASES:
        raise FusebenchError(f"models.{name}.text.case={case!r} is not valid; valid: {', '.join(TEXT_CASES)}.")
    template = text.get("template")
    if template is not None and (not isinstance(template, str) or template.count("{}") != 1):
        raise FusebenchError(f"models.{name}.text.template={template!r} must be a string with exactly one '{{}}'.")
    text["case"], text["template"] = case, template
    return text


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
