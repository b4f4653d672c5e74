"""Static files are served by SlotServe itself (WhiteNoise), on `./slotserve start` and in
Compose alike: the admin is styled, and the API docs' Swagger UI loads from this installation."""

from __future__ import annotations

import re

import pytest
from django.test import Client


@pytest.mark.django_db
def test_the_admin_stylesheet_is_served():
    answer = Client().get("/static/admin/css/base.css")
    assert answer.status_code == 200 and answer["content-type"].startswith("text/css")
    assert b"".join(answer.streaming_content).strip()  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_the_api_docs_load_their_swagger_ui_from_this_installation():
    client = Client()
    page = client.get("/api/docs/").content.decode()
    scripts = re.findall(r'src="([^"]+swagger-ui-bundle\.js)"', page)
    assert scripts and scripts[0].startswith("/static/"), scripts  # not a CDN
    bundle = client.get(scripts[0])
    assert bundle.status_code == 200
    assert b"SwaggerUIBundle" in b"".join(bundle.streaming_content)  # type: ignore[attr-defined]
