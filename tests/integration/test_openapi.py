"""The OpenAPI document against the API it describes.

The document must list exactly the routes the app serves, and every answer
the API gives must be one the document promises. schemathesis generates
valid and invalid requests from the document, sends them with the client's
token, with none and with a bad one, and runs all of its default checks on
the answers: operation by operation, then in sequences of calls that feed
one answer into the next (create, then read or cancel what was created).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import Any, Final

import pytest
import schemathesis
from flask import Flask
from hypothesis import strategies as st
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.formats import unregister_string_format
from schemathesis.specs.openapi.schemas import OpenApiSchema
from sqlalchemy import delete

from gateway.credentials.catalog import catalog_path, load_catalog
from gateway.elicitations.models import Elicitation, IdempotencyRecord
from gateway.elicitations.schemas import ELICITATION_ID
from gateway.pagination import encode_cursor
from gateway.settings import Settings
from gateway.web.api import PREFIX
from gateway.web.openapi import CURSOR_FORMAT
from tests.conftest import Registered

ORIGIN: Final = "https://gateway.test"
DOCUMENT: Final = f"{PREFIX}/openapi.json"
# Fixed, so that a failure found once is found again on every run and machine.
SEED: Final = 20_251_125
# Per operation and phase, and stateful scenarios: the file needs about 25 s of CPU.
MAX_EXAMPLES: Final = 30
# Calls per stateful scenario: enough for create → read → cancel → read.
MAX_STEPS: Final = 6


class _NoWaiting:
    """A long-poll hub without a free slot: every wait returns at once.

    Generated reads ask for ``?wait=`` of up to 60 s. With no slot free the
    API answers at once with the current state (its documented behaviour
    under load), which keeps the run fast; waiting itself is tested apart.
    """

    def wait(self, elicitation_id: str, timeout: float, connection: int | None = None) -> bool:
        return False


# The document describes the deployment: payments appear only where Stripe is
# configured. Both shapes are checked; creating a payment elicitation does not
# call Stripe, so placeholder keys suffice.
_STRIPE: Final = {"GATEWAY_STRIPE_SECRET_KEY": "sk_test_placeholder",
                  "GATEWAY_STRIPE_WEBHOOK_SECRET": "whsec_placeholder"}


@pytest.fixture(params=[False, True], ids=["without-payments", "with-payments"])
def settings(request: pytest.FixtureRequest, make_settings: Callable[..., Settings]) -> Settings:
    """Settings with rate limits out of reach, with or without payments.

    The limits count per wall-clock minute, so whether a run met them would
    depend on when it started. 429 stays documented and is tested apart.
    """
    return make_settings(GATEWAY_RATELIMIT_API="1000000/minute",
                         GATEWAY_RATELIMIT_API_IP="1000000/minute",
                         **(_STRIPE if request.param else {}))


@pytest.fixture
def fuzzed_app(app: Flask) -> Flask:
    """The app, with long-polls answered at once."""
    app.extensions["gateway.waits"] = _NoWaiting()
    return app


@pytest.fixture
def api_token(settings: Settings, register: Callable[..., Registered]) -> str:
    """The API token of a client allowed every credential type of the catalog.

    Allowed all, so that every credential_type the document offers is one
    this client may ask for: a schema-valid body is then one it may send.
    """
    catalog = load_catalog(catalog_path(settings))
    return register("openapi-run", credential_types=catalog.ids).api_token


@pytest.fixture
def cursor_format() -> Iterator[None]:
    """Generated paging cursors are ones the API could have returned.

    A cursor is opaque: the document can say no more than "a next_cursor you
    were given", and the API rightly refuses any other string. So that valid
    requests carry valid cursors, generation makes real ones, at random
    positions.
    """
    cursors = st.builds(
        encode_cursor,
        st.datetimes(timezones=st.just(UTC)),
        st.from_regex(ELICITATION_ID, fullmatch=True))
    schemathesis.openapi.format(CURSOR_FORMAT, cursors)
    yield
    unregister_string_format(CURSOR_FORMAT)


def _config(api_token: str) -> schemathesis.Config:
    # Every default check stays on, with its default expected statuses. For
    # positive_data_acceptance those already include 409 and 429, the two
    # answers the API gives to a valid request by design (an Idempotency-Key
    # reused with another body, a cancel of what has ended; a rate limit),
    # and the document declares both where they occur, so nothing needs
    # widening. 422 stays unexpected: a valid body the API refuses means the
    # document allows too much.
    return schemathesis.Config.from_dict({
        "seed": SEED,
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
        "phases": {"stateful": {"max-steps": MAX_STEPS}},
        "auth": {"openapi": {"bearer": {"bearer": api_token}}},
    })


@pytest.fixture
def api_schema(fuzzed_app: Flask, api_token: str, cursor_format: None) -> OpenApiSchema:
    """The document as schemathesis reads it from the app."""
    return schemathesis.openapi.from_wsgi(DOCUMENT, fuzzed_app, config=_config(api_token),
                                          base_url=ORIGIN)


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis (4.32) labels each operation's results by rewriting
    # Node._nodeid, an attribute pytest 9.2 no longer has (the id lives in
    # Node._id). Giving it one lets it run; its rewrites then touch only its
    # own attribute, never the id pytest reports.
    request.node._nodeid = request.node.nodeid


def test_document_is_openapi_3_1_and_matches_the_routes(
    api_schema: OpenApiSchema, fuzzed_app: Flask,
) -> None:
    api_schema.validate()
    assert api_schema.raw_schema["openapi"] == "3.1.0"
    documented = {(path, method.upper())
                  for path, item in api_schema.raw_schema["paths"].items() for method in item}
    served = {(_openapi_path(rule.rule), method)
              for rule in fuzzed_app.url_map.iter_rules() if rule.rule.startswith(f"{PREFIX}/")
              for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
    assert documented == served


def _openapi_path(rule: str) -> str:
    # Werkzeug writes <converter:name>, OpenAPI {name}.
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_every_answer_is_documented(case: Case) -> None:
    # base_url: the gateway answers only https requests to its public host.
    case.call_and_validate(base_url=ORIGIN)


def test_every_answer_is_documented_across_calls(api_schema: OpenApiSchema,
                                                 fuzzed_app: Flask) -> None:
    engine = fuzzed_app.extensions["gateway.engine"]

    class Calls(api_schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            return {"base_url": ORIGIN}

        def teardown(self) -> None:
            # Each scenario starts with no elicitations, so that a failing
            # one replays the same way while it is shrunk.
            with engine.begin() as connection:
                connection.execute(delete(IdempotencyRecord))
                connection.execute(delete(Elicitation))

    Calls.run(settings=api_schema.config.get_hypothesis_settings(apply_ci_profile=False))
