"""The REST API's own pages: its schema and docs, and who the caller is (``/api/me/``)."""

from __future__ import annotations

from reservations.models import Profile
from tests.factories import client_for


def test_openapi_schema_and_docs(db, ana):
    schema = client_for(ana).get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/reservations/{id}/extend" in schema.content
    docs = client_for(ana).get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_me_endpoint(db, ana_api):
    me = ana_api.get("/api/me/").data
    assert me["username"] == "ana" and me["time_zone"] == "UTC" and me["calendar_url"].endswith(".ics")
    changed = ana_api.patch(
        "/api/me/", {"time_zone": "Asia/Shanghai", "email_events": {"approved": False}}, format="json"
    )
    assert changed.status_code == 200 and changed.data["time_zone"] == "Asia/Shanghai"
    bad = ana_api.patch("/api/me/", {"time_zone": "Mars/Olympus"}, format="json")
    assert bad.status_code == 400 and bad.data["message"].startswith("time_zone: 'Mars/Olympus' is not")
    bad_events = ana_api.patch("/api/me/", {"email_events": {"spam": True}}, format="json")
    assert bad_events.status_code == 400 and "email_events" in bad_events.data
    assert Profile.objects.get(user__username="ana").time_zone == "Asia/Shanghai"
