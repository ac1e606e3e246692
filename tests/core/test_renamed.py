"""A renamed public name keeps working for one release, with a warning naming the new one."""

from __future__ import annotations

import inspect

import pytest

from vitreg import configs
from vitreg.fix import leaderboard
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
        (leaderboard, "Board", "BoardResults"),
        (leaderboard, "BoardRow", "BoardEntry"),
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


def test_loose_keywords_of_an_older_signature_build_the_settings_part() -> None:
    from pydantic import BaseModel

    from vitreg.core.renamed import loose_settings

    class Search(BaseModel):
        top_k: int = 64
        target: float = 0.01

    @loose_settings("search", Search, ("top_k", "target"))
    def find(model: str, search: Search | None = None, *, batch_size: int = 32):
        return model, search, batch_size

    assert find("m") == ("m", None, 32)  # the new form: untouched, no warning
    with pytest.warns(DeprecationWarning, match=r"find\(top_k=\.\.\.\) is now .*Search\(top_k"):
        assert find("m", top_k=8, batch_size=4) == ("m", Search(top_k=8), 4)
    with pytest.warns(DeprecationWarning):  # on top of a part given
        assert find("m", Search(target=0.5), top_k=8)[1] == Search(top_k=8, target=0.5)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError):
        find("m", top_k="many")  # validated as the part validates it


def test_the_neuron_search_keeps_its_loose_keywords_for_a_release() -> None:
    from vitreg.neurons.auto import find_neurons
    from vitreg.neurons.calibrate import calibrate_top_k
    from vitreg.neurons.discover import discover

    for fn in (find_neurons, discover, calibrate_top_k):
        assert "search" in inspect.signature(fn).parameters and fn.__wrapped__
