"""The strict checks of a YAML config: a repeated key and a boolean for a number."""

from __future__ import annotations

import pytest

from vitreg.configs import DiagnoseConfig
from vitreg.core.yaml_strict import duplicate_key, refuse_bool_numbers
from vitreg.errors import InputError


def test_duplicate_key_is_found_at_any_depth_with_its_line() -> None:
    assert duplicate_key("a: 1\nb: 2\n") is None
    assert duplicate_key("a: 1\nb: 2\na: 3\n") == ("a", 3)
    assert duplicate_key("x:\n  - {k: 1, k: 2}\n") == ("k", 2)
    assert duplicate_key("x: {a: 1}\ny: {a: 1}\n") is None  # same key in two mappings
    assert duplicate_key("") is None


def test_a_boolean_for_a_number_is_refused_with_the_key_named() -> None:
    fields = DiagnoseConfig.model_fields
    refuse_bool_numbers({"random_init": True}, fields, "cfg")  # a boolean setting takes a boolean
    with pytest.raises(InputError, match="limit is true, but limit is a number"):
        refuse_bool_numbers({"limit": True}, fields, "cfg")
    with pytest.raises(InputError, match="max_maps is false"):
        refuse_bool_numbers({"max_maps": False}, fields, "cfg")
