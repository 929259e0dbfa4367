"""English the pages and messages build from names they do not know in advance.

Credential type labels come from the operator's catalog ("OpenAI API key",
"GitHub token", "HTTP token"), so "a" or "an" before one is chosen by how the
label is said, not how it is spelled: "an API key" (ay-pee-eye), "a URL"
(you-are-el), "an OpenAI API key", "a Hugging Face token", "an hour".
"""

from __future__ import annotations

import re
from typing import Final

# Letters whose names start with a vowel sound: "an F", "an HTTP token", "an SSH key".
_VOWEL_SOUND_LETTERS: Final = frozenset("AEFHILMNORSX")
# Words spelled with a vowel but said with a consonant: "a user", "a one-time code".
_CONSONANT_SOUND_STARTS: Final = ("uni", "use", "usa", "usi", "usu", "uti", "ure", "uro", "eu",
                                  "ewe", "one", "once", "ubiq")
# Words spelled with "h" whose h is silent: "an hour", "an honest".
_SILENT_H_STARTS: Final = ("hour", "honest", "honor", "honour", "heir")
# Numbers said with a vowel sound first: eight, eighty..., eleven, eighteen (thousand).
_VOWEL_SOUND_NUMBER: Final = re.compile(r"8\d*|(11|18)(\d{3})*")
_FIRST_WORD: Final = re.compile(r"[A-Za-z0-9]+")


def article(phrase: str) -> str:
    """"a" or "an" for ``phrase``, by the sound of its first word."""
    found = _FIRST_WORD.search(phrase)
    if found is None:
        return "a"
    word = found.group()
    if word[0].isdigit():
        number = word[:len(word) - len(word.lstrip("0123456789"))]
        return "an" if _VOWEL_SOUND_NUMBER.fullmatch(number) else "a"
    if _is_spelled_out(word):
        return "an" if word[0] in _VOWEL_SOUND_LETTERS else "a"
    lower = word.lower()
    if lower.startswith(_SILENT_H_STARTS):
        return "an"
    if lower.startswith(_CONSONANT_SOUND_STARTS):
        return "a"
    return "an" if lower[0] in "aeiou" else "a"


def with_article(phrase: str) -> str:
    """``phrase`` after its indefinite article: "an OpenAI API key", "a GitHub token"."""
    return f"{article(phrase)} {phrase}"


def _is_spelled_out(word: str) -> bool:
    """Whether the word is said letter by letter: an acronym (API, HTTP) or a lone letter."""
    letters = [c for c in word if c.isalpha()]
    if len(letters) == 1:
        return True
    # Upper case throughout ("API", "HTTP2"); "OpenAI" and "GitHub" are said as words.
    return all(c.isupper() for c in letters)
