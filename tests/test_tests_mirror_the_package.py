"""The tests mirror the package: every folder under tests/ names a package or module of
src/vitreg (tests/models/adapters for vitreg.models.adapters), except those that test across
packages: hostile (every hostile input, by class), benchmarks (the scripts in benchmarks/), docs
(the scripts in docs/) and gpu (the CUDA parity checks of benchmarks/gpu.sh). A folder whose
name starts with ``_`` or ``.`` holds no tests (helpers, fixture files), nor anything inside it."""

from __future__ import annotations

from pathlib import Path

import vitreg
from conftest import ROOT, TESTS

SRC = Path(vitreg.__file__).parent
ACROSS = {
    "hostile": "hostile inputs of every verb",
    "benchmarks": "smoke runs of benchmarks/",
    "gpu": "CUDA against CPU across packages (hooks, attention, the fix), run by gpu.sh",
    "docs": "the scripts in docs/ that build the site's pages",
}


def test_every_test_folder_names_a_package_or_module():
    folders = [p for p in TESTS.rglob("*") if p.is_dir()]
    assert folders, "the tests are in package folders"
    for folder in folders:
        parts = folder.relative_to(TESTS).parts
        if any(part.startswith((".", "_")) for part in parts):
            continue  # helpers and fixture files (tests/report/_golden/<run>/figures)
        if parts[0] in ACROSS:
            assert parts[0] not in ("benchmarks", "docs") or (ROOT / parts[0]).is_dir()
            continue
        target = SRC.joinpath(*parts)
        assert target.is_dir() or target.with_suffix(".py").is_file(), folder


def test_only_conftest_and_whole_package_checks_stay_at_the_top():
    """Shared helpers and worker scripts live in tests/_support/."""
    top = sorted(p.name for p in TESTS.glob("*.py"))
    assert top == [
        "conftest.py",
        "test_house.py",
        "test_layering.py",
        "test_readme_snippets.py",
        "test_tests_mirror_the_package.py",
        "test_token_indexing.py",
    ]
