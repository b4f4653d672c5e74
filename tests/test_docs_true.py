"""The house keeps its word: every setting docs/settings.md lists is one SlotServe reads and
every one it reads is listed there, every gateway error code is in docs/api.md, comments cite
no section a document lacks, and modules stay under 400 lines."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_compose_file import settings_read

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("channels_app", "gateway", "portal", "reservations", "slotserve_base", "slotserve_site")


def settings_documented() -> set[str]:
    """The variables named in the first column of docs/settings.md's tables."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "settings.md").read_text().splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", first))
    return names


def test_every_documented_setting_is_read_and_every_read_setting_documented():
    documented, read = settings_documented(), settings_read()
    assert documented - read == set(), f"documented, never read: {sorted(documented - read)}"
    assert read - documented == set(), f"read, not in docs/settings.md: {sorted(read - documented)}"


def test_the_pool_timeout_docs_name_is_the_one_the_pool_waits(monkeypatch, tmp_path):
    from slotserve_site.database_settings import databases

    monkeypatch.setenv("SLOTSERVE_DB_POOL_TIMEOUT", "3.5")
    chosen = databases("postgres://u@db.example/slotserve", tmp_path)
    assert chosen["default"]["OPTIONS"]["pool"]["timeout"] == 3.5
    monkeypatch.delenv("SLOTSERVE_DB_POOL_TIMEOUT")
    assert (
        databases("postgres://u@db.example/slotserve", tmp_path)["default"]["OPTIONS"]["pool"]["timeout"]
        == 20
    )


def test_every_gateway_error_code_is_in_the_api_docs_table():
    from slotserve_base.vocabulary import ErrorCode

    table = [line for line in (ROOT / "docs" / "api.md").read_text().splitlines() if line.startswith("| `")]
    listed = {code for line in table for code in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert set(ErrorCode.values) - listed == set(), sorted(set(ErrorCode.values) - listed)


def test_no_comment_cites_a_section_number_no_document_has():
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in (
            "channels_app",
            "gateway",
            "portal",
            "reservations",
            "slotserve_base",
            "slotserve_site",
        )
        for path in (ROOT / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "\u00a7" in line
    ]
    assert cited == []


def test_no_module_of_the_product_passes_400_lines():
    """Modules stay small: a file past 400 lines is split by concern (its migrations aside)."""
    long = {
        str(path.relative_to(ROOT)): count
        for folder in PRODUCT
        for path in (ROOT / folder).rglob("*.py")
        if "migrations" not in path.parts and (count := len(path.read_text().splitlines())) > 400
    }
    assert long == {}


def test_the_pre_commit_hook_runs_what_ci_checks():
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert [hook["entry"] for hook in hooks] == ["./slotserve check"]
    assert "./slotserve check" in (ROOT / ".ci" / "run").read_text()


def test_the_defaults_docs_settings_md_states_are_the_codes():
    """Where the table gives a plain number as a setting's default, the code reads the same."""
    from tests.test_compose_file import SETTINGS_SOURCES

    source = "\n".join((ROOT / path).read_text() for path in SETTINGS_SOURCES)
    checked, wrong = 0, []
    for line in (ROOT / "docs" / "settings.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) < 2 or not re.fullmatch(r"`[A-Z0-9_]+`", cells[0]):
            continue
        name, stated = cells[0].strip("`"), cells[1].split(" ")[0].strip("`")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", stated):
            continue
        read = re.search(rf'env_\w+\(\s*"{name}",\s*([0-9. *]+)[,)]', source)
        if read is None:
            continue
        checked += 1
        value = 1.0
        for factor in read.group(1).split("*"):  # 10 * 1024 * 1024
            value *= float(factor)
        if value != float(stated):
            wrong.append((name, stated, read.group(1)))
    assert checked >= 20 and wrong == [], (checked, wrong)


def words_in_the_house(pattern: str) -> list[str]:
    """Where ``pattern`` occurs in the product, its tests, benches and docs (path:line)."""
    found = []
    folders = (*PRODUCT, "tests", "bench", "docs", "docker", "scripts", "devtools")
    for folder in folders:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in {".py", ".md", ".yaml", ".html", ".txt", ""} or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if re.search(pattern, line) and path != Path(__file__):
                    found.append(f"{path.relative_to(ROOT)}:{number}")
    return found


def test_the_node_worker_has_one_name():
    """ "node worker" in words, ``node_worker`` in code, ``nodeworker`` only as the command
    (Django's spelling of commands, as ``runserver``)."""
    assert words_in_the_house(r"node[_ -]agent") == []
    # The command, as typed (``manage.py nodeworker``) or as an argument list's element.
    as_the_command = re.compile(r"manage\.py\W+nodeworker|^\s*\"nodeworker\",$")
    commands = [hit for hit in words_in_the_house(r"nodeworker") if not as_the_command.search(_line(hit))]
    assert commands == [], "nodeworker appears other than as the command's name"


def test_announce_means_a_happening_told_outside_and_the_overview_is_refreshed():
    """docs/architecture.md gives the word its one meaning; nothing else uses it for the overview."""
    said = {hit for hit in words_in_the_house(r"[Aa]nnounce") if "overview" in _line(hit)}
    assert {hit for hit in said if '"announce" means one thing' not in _line(hit)} == set()
    assert len(said) == 1, "the glossary line says it"


def _line(hit: str) -> str:
    path, number = hit.rsplit(":", 1)
    return (ROOT / path).read_text().splitlines()[int(number) - 1]
