"""Registry[T]: names, glob listing, lazy "module:attr" entries, priority order, filling."""

from __future__ import annotations

import sys

import pytest

from vitreg.core import plugins
from vitreg.core.registry import Registry


def test_entries_by_name_decorator_and_glob():
    reg: Registry[int] = Registry("numbers")
    reg.register("one", 1)

    @reg.register("double")
    def double(x: int) -> int:
        return 2 * x

    assert reg.get("one") == 1 and reg["double"] is double and "one" in reg
    assert reg.names("d*") == ["double"] and reg.names() == ["one", "double"] and len(reg) == 2
    with pytest.raises(KeyError, match="no numbers 'three'; known: one, double"):
        reg.get("three")


def test_lazy_entries_import_on_first_use():
    reg: Registry[object] = Registry("lazy")
    reg.register("dumps", "json:dumps")
    import json

    assert reg.get("dumps") is json.dumps
    with pytest.raises(ValueError, match="'module:attr'"):
        reg.register("bad", "json.dumps")


def test_priority_orders_entries_and_ties_keep_registration_order():
    reg: Registry[int] = Registry("adapters-test")
    reg.register("generic", 1)
    reg.register("specific", 2, priority=10)
    reg.register("other", 3)
    assert reg.names() == ["specific", "generic", "other"]
    assert reg.values() == [2, 1, 3]


def test_a_registry_fills_from_its_modules_and_plugins(tmp_path, monkeypatch):
    (tmp_path / "vitreg_reg_builtin.py").write_text(
        "from tests_registry_target import REG\nREG.register('builtin', 1)\n"
    )
    (tmp_path / "vitreg_reg_plugin.py").write_text(
        "from tests_registry_target import REG\nREG.register('plugin', 2, priority=1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[int] = Registry("registry-test", modules=("vitreg_reg_builtin",))
    target = type(sys)("tests_registry_target")
    target.REG = reg
    monkeypatch.setitem(sys.modules, "tests_registry_target", target)
    plugins.provide("registry-test", "vitreg_reg_plugin")
    assert reg.names() == ["plugin", "builtin"] and reg.get("builtin") == 1
