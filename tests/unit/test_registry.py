import pytest

from nemo_azr.errors import ConfigError
from nemo_azr.registry import Registry


def test_register_and_lookup():
    reg = Registry("widget")

    @reg.register("a", "alias_a")
    def a():
        return 1

    assert reg.get("a") is a and reg.get("alias_a") is a
    assert "a" in reg and reg.names() == ["a", "alias_a"]


def test_unknown_name_lists_known():
    reg = Registry("widget")
    reg.register("one")(object())
    with pytest.raises(ConfigError, match="unknown widget 'two'; known: one"):
        reg.get("two")


def test_double_registration_is_refused():
    reg = Registry("widget")
    reg.register("x")(lambda: 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x")(lambda: 2)
