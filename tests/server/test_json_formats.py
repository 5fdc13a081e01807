"""JSON-schema string formats the grammar does not enforce as defined (``email``, ``uri``,
``hostname``...) are accepted, as llama-server accepts them: an email address and a URI
are written in a plain form that meets them (pydantic's ``HttpUrl`` and an email field
parse through ``client.chat.completions.parse``), any other format is ignored and the
string follows its other keywords."""

from __future__ import annotations

import json
import re
from typing import Annotated

import pytest
from pydantic import BaseModel, Field, HttpUrl
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "moescope-demo-qwen3moe"
ASK = [{"role": "user", "content": "Who wrote this page, and where is it?"}]
EMAIL = re.compile(r"[A-Za-z0-9_%+-][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+\.[a-z]{2,6}")


class Contact(BaseModel):
    email: Annotated[str, Field(json_schema_extra={"format": "email"})]
    homepage: HttpUrl
    host: Annotated[str, Field(max_length=12, json_schema_extra={"format": "hostname"})]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_pydantic_model_with_email_and_url_parses(server: Server, seed: int) -> None:
    schema = Contact.model_json_schema()
    assert schema["properties"]["homepage"]["format"] == "uri"  # pydantic's, as sent
    completion = server.client().chat.completions.parse(
        model=MODEL, messages=ASK, response_format=Contact, max_tokens=400, seed=seed,
        temperature=0.8)
    [choice] = completion.choices
    assert choice.finish_reason == "stop", choice.message.content
    contact = choice.message.parsed
    assert isinstance(contact, Contact)
    assert EMAIL.fullmatch(contact.email), contact.email
    assert contact.homepage.scheme in ("http", "https") and contact.homepage.host
    assert len(contact.host) <= 12  # hostname ignored, maxLength kept


@pytest.mark.parametrize("fmt", ["email", "uri", "url", "idn-email", "hostname",
                                 "uri-reference", "int32", "binary"])
def test_any_format_is_accepted(server: Server, fmt: str) -> None:
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt,
                                                     "maxLength": 150}},
              "required": ["v"]}
    r = server.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=300, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "v", "schema": schema}})
    value = json.loads(r.choices[0].message.content)["v"]
    assert isinstance(value, str) and len(value) <= 150
    if fmt in ("email", "idn-email"):
        assert EMAIL.fullmatch(value), value
    elif fmt in ("uri", "url"):
        assert re.fullmatch(r"https?://[A-Za-z0-9-]+(\.[a-z]{2,6})?(/[A-Za-z0-9._~%/-]*)?",
                            value), value
