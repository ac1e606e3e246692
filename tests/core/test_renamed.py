"""A renamed public name keeps working for one release, with a warning naming the new one."""

from __future__ import annotations

import pytest

from vitreg import configs
from vitreg.probe import linear
from vitreg.results import base


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (configs, "Part", "SettingsPart"),
        (base, "Strict", "ResultsModel"),
        (base, "Sparse", "SparseResults"),
        (base, "Open", "OpenResults"),
        (linear, "ProbeConfig", "FitSettings"),
    ],
)
def test_an_old_name_warns_and_gives_the_new_object(module, old, new) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old} is now .*{new}"):
        assert getattr(module, old) is getattr(module, new)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        configs.Nope  # noqa: B018


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("vitreg.report.schema", "vitreg.results.schema"),
        ("vitreg.report.results.neurons", "vitreg.results.neurons"),
        ("vitreg.report.verbs.fix", "vitreg.report.renderers.fix"),
        ("vitreg.train.settings", "vitreg.settings.train"),
    ],
)
def test_a_moved_module_imports_under_its_old_name_as_the_new_module(old, new) -> None:
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_the_result_of_the_automatic_path_keeps_its_old_name() -> None:
    from vitreg.neurons import auto

    with pytest.warns(DeprecationWarning, match="Found is now .*NeuronSearchResult"):
        assert auto.Found is auto.NeuronSearchResult
