"""The models page: each model with its presets, its memory and the channels that can run it."""

from __future__ import annotations

from tests.factories import client_for


def test_models_page_lists_presets_and_vram(portal, ana):
    page = client_for(ana).get("/models/").content.decode()
    assert "llama-70b" in page
    assert "-c 8192 -ngl 99" in page  # --port 9 removed
    row = page[page.index('data-model="llama-70b"') :]
    assert "a100-0" in row[: row.index("</tr>")]
