"""The neurons library's results are the results models: the old names of its former mirror
classes still resolve to them for one release, with a warning."""

import pytest

from vitreg.neurons import NeuronSearchResult, causal, detection
from vitreg.results.neurons import Causal, DetectionRecord, Discovered


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [(detection, "Detection", DetectionRecord), (causal, "CausalSelection", Causal)],
)
def test_the_old_mirror_names_are_the_results_models(module, old, new) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old} is now"):
        assert getattr(module, old) is new


def test_the_search_result_is_the_results_model_and_keeps_its_sets_out_of_the_file() -> None:
    assert issubclass(NeuronSearchResult, Discovered)
    assert set(NeuronSearchResult.model_fields) == set(Discovered.model_fields)
    assert {"chosen", "ranked", "detection", "split"} <= set(dir(NeuronSearchResult))
