"""The currencies Stripe charges in, and how many minor units make one major unit.

Amounts travel in the currency's minor unit (cents for usd, yen for jpy), as
Stripe's API takes them. The list is Stripe's presentment currencies
(https://docs.stripe.com/currencies); a code outside it is refused when the
elicitation is created, not when the user is already on the payment page.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Final

CURRENCIES: Final = frozenset({
    "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bhd", "bif", "bmd", "bnd", "bob", "brl", "bsd", "bwp", "byn", "bzd", "cad", "cdf",
    "chf", "clp", "cny", "cop", "crc", "cve", "czk", "djf", "dkk", "dop", "dzd", "egp", "etb",
    "eur", "fjd", "fkp", "gbp", "gel", "gip", "gmd", "gnf", "gtq", "gyd", "hkd", "hnl", "htg",
    "huf", "idr", "ils", "inr", "isk", "jmd", "jod", "jpy", "kes", "kgs", "khr", "kmf", "krw",
    "kwd", "kyd", "kzt", "lak", "lbp", "lkr", "lrd", "lsl", "mad", "mdl", "mga", "mkd", "mmk",
    "mnt", "mop", "mur", "mvr", "mwk", "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr",
    "nzd", "omr", "pab", "pen", "pgk", "php", "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub",
    "rwf", "sar", "sbd", "scr", "sek", "sgd", "shp", "sle", "sos", "srd", "std", "szl", "thb",
    "tjs", "tnd", "top", "try", "ttd", "twd", "tzs", "uah", "ugx", "usd", "uyu", "uzs", "vnd",
    "vuv", "wst", "xaf", "xcd", "xof", "xpf", "yer", "zar", "zmw",
})

# Stripe's zero-decimal currencies: the amount is in whole units already.
ZERO_DECIMAL: Final = frozenset({
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
})
THREE_DECIMAL: Final = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


def is_known(currency: str) -> bool:
    """Whether Stripe charges in ``currency`` (lower-case ISO 4217 code)."""
    return currency in CURRENCIES


def decimals(currency: str) -> int:
    """Digits after the decimal point of one major unit of ``currency``."""
    if currency in ZERO_DECIMAL:
        return 0
    return 3 if currency in THREE_DECIMAL else 2


def format_amount(amount: int, currency: str) -> str:
    """``1999, "usd"`` → ``"19.99 USD"``: the code, not a symbol, so "$" is never ambiguous."""
    places = decimals(currency)
    major = Decimal(amount).scaleb(-places)
    return f"{major:,.{places}f} {currency.upper()}"
