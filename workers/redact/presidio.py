"""Presidio's recognizers, offline, for what they do well on written text: e-mail addresses
(with a top-level-domain check), phone numbers (Google's libphonenumber), US social security
numbers (with its invalid-number rules) and card numbers (issuer patterns plus Luhn).

There is no maintained English spaCy pipeline on the package index here (``en_core_web_sm``
is published on GitHub, not PyPI; the PyPI copies are unofficial re-uploads), so Presidio
runs on a blank English spaCy pipeline: tokens, no NER. Person, address and date of birth
are ours (``speech``), from cue phrases. Loaded once per process, lazily.
"""

from __future__ import annotations

import functools
from typing import Any

# Presidio's entity names → ours.
ENTITY_TYPES = {
    "EMAIL_ADDRESS": "email",
    "PHONE_NUMBER": "phone",
    "US_SSN": "ssn",
    "CREDIT_CARD": "card_number",
}


@functools.lru_cache(maxsize=1)
def analyzer() -> Any:
    import spacy
    import tldextract
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        PhoneRecognizer,
        UsSsnRecognizer,
    )

    # tldextract's default extractor fetches the public suffix list over the network on first
    # use; its bundled snapshot is enough to tell "example.com" from "mampl.xyz2".
    offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    class OfflineEmailRecognizer(EmailRecognizer):
        def validate_result(self, pattern_text: str) -> bool:
            return bool(offline(pattern_text).suffix)

    class BlankEnglish(SpacyNlpEngine):
        def load(self) -> None:
            self.nlp = {"en": spacy.blank("en")}  # type: ignore[assignment]

    engine = BlankEnglish(models=[{"lang_code": "en", "model_name": "blank"}])
    engine.load()
    registry = RecognizerRegistry(supported_languages=["en"])
    for recognizer in (
        OfflineEmailRecognizer(),
        PhoneRecognizer(supported_regions=("US", "GB", "CA")),
        UsSsnRecognizer(),
        CreditCardRecognizer(),
    ):
        registry.add_recognizer(recognizer)
    return AnalyzerEngine(nlp_engine=engine, registry=registry, supported_languages=["en"])


def presidio_spans(text: str, types: tuple[str, ...]) -> list[tuple[str, int, int, float]]:
    """(our type, start char, end char, score) of what Presidio finds in ``text``."""
    wanted = [name for name, ours in ENTITY_TYPES.items() if ours in types]
    if not wanted or not text:
        return []
    results = analyzer().analyze(text, language="en", entities=wanted)
    return [(ENTITY_TYPES[r.entity_type], r.start, r.end, float(r.score)) for r in results]
