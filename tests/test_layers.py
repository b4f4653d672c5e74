"""The layers of the flow hold (pyproject.toml, ``[tool.importlinter]``), and the checker that
``./slotserve check`` runs does fail on a new cycle or a forbidden import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
# From the top of the flow to its bottom.
PACKAGES = (
    "slotserve_site",
    "portal",
    "gateway",
    "reservations",
    "channels_app",
    "slotserve_base",
    "devtools",
)
FLOW = PACKAGES[:-1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=where, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_layers(tree_copy):
    done = _lint(tree_copy)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        # The node worker reaching into the gateway: a layer upside down.
        (
            "channels_app/node_worker/bad.py",
            "import gateway.proxy\n",
            "channels_app.node_worker is not allowed to import gateway",
        ),
        # A cycle: the scheduler's decision importing the node worker that imports it.
        (
            "channels_app/scheduling/bad.py",
            "from channels_app.node_worker import worker\n",
            "not allowed to import channels_app.node_worker",
        ),
        # Settings importing app code.
        ("slotserve_site/settings_extra.py", "", ""),
        # A pure rule of the gateway reaching up into the application that runs it.
        (
            "gateway/rules/bad.py",
            "from gateway.serve import proxy\n",
            "gateway.rules is not allowed to import gateway.serve",
        ),
    ],
)
def test_a_forbidden_import_fails_the_check(tree_copy, module, source, complaint):
    if not source:  # settings: append the import to the real settings module
        settings = tree_copy / "slotserve_site" / "settings.py"
        settings.write_text(settings.read_text() + "\nfrom channels_app import models  # noqa\n")
        complaint = "slotserve_site.settings is not allowed to import channels_app"
    else:
        (tree_copy / module).write_text(source)
    done = _lint(tree_copy)
    assert done.returncode != 0
    assert complaint in done.stdout, done.stdout[-3000:]


def test_between_packages_one_arrow_runs_up_the_scheduler_reading_bookings():
    """Each package imports only those below it in the flow, but for one arrow: the scheduler
    reads the bookings it decides on (docs/architecture.md). Everything else of channels_app
    that needs bookings asks the scheduler's selectors; the node worker's news reaches the
    bookers through a signal the reservations app listens to."""
    graph = grimp.build_graph(*FLOW, cache_dir=None, exclude_type_checking_imports=True)
    direct = {
        (i["importer"], i["imported"])
        for lower_index, lower in enumerate(FLOW)
        for higher in FLOW[:lower_index]
        for i in graph.find_matching_direct_imports(import_expression=f"{lower}.** -> {higher}.**")
    }
    assert direct == {("channels_app.scheduling.selectors", "reservations.models")}, sorted(direct)


# As pyproject.toml states them: usage beside the stream, independent of it.
GATEWAY_ROOMS = (
    grimp.Layer("serve"),
    grimp.Layer("stream", "usage", independent=True),
    grimp.Layer("admit"),
    grimp.Layer("wire"),
    grimp.Layer("rules"),
    grimp.Layer("types"),
)


def _gateway_graph() -> grimp.ImportGraph:
    # Imports for type hints too: a circle that only type hints hide is still a circle to a reader.
    return grimp.build_graph("gateway", cache_dir=None, exclude_type_checking_imports=False)


def test_the_gateways_rooms_keep_their_order_even_through_type_hints():
    graph = _gateway_graph()
    upward = graph.find_illegal_dependencies_for_layers(layers=GATEWAY_ROOMS, containers={"gateway"})
    assert upward == set(), sorted((d.importer, d.imported) for d in upward)


def test_no_module_of_the_gateway_imports_itself_round_a_circle():
    graph = _gateway_graph()
    modules = sorted(graph.modules)
    circles = [
        (module, other)
        for module in modules
        for other in graph.find_modules_directly_imported_by(module)
        if other != module and graph.chain_exists(importer=other, imported=module)
    ]
    assert circles == [], circles[:10]


def test_every_stage_of_the_gateway_lives_in_a_room():
    """Along the flow only the rooms, the Django app's own modules and the usage reports sit in
    ``gateway/``: a newcomer names each stage's room from the folder names."""
    top = sorted(p.stem for p in (ROOT / "gateway").glob("*.py"))
    assert top == [
        "__init__",
        "admin",
        "api",
        "api_keys",
        "apps",
        "authentication",
        "filters",
        "models",
        "tasks",
        "types",
    ]
    rooms = sorted(
        p.name for p in (ROOT / "gateway").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )
    assert rooms == ["admit", "management", "migrations", "rules", "serve", "stream", "usage", "wire"]
