"""``marlkit._utils``: logging and optional dependencies; the argument checks moved to
``marlkit._checks`` (``tests/test_checks.py``)."""

from __future__ import annotations

import logging

import pytest

import marlkit._checks
import marlkit._utils
from marlkit._utils import get_logger, has_module, import_optional


def test_the_checks_live_in_checks_only() -> None:
    for name in ("check_int", "check_real", "check_flag", "close_matches", "check_kwargs"):
        assert hasattr(marlkit._checks, name) and not hasattr(marlkit._utils, name)


def test_logger_and_optional_modules() -> None:
    assert get_logger() is logging.getLogger("marlkit")
    assert get_logger("envs").name == "marlkit.envs"
    assert has_module("json") and not has_module("no_such_module_marlkit")
    assert import_optional("json", extra="none").__name__ == "json"
    with pytest.raises(ImportError, match=r"pip install 'marlkit\[vmas\]'"):
        import_optional("no_such_module_marlkit", extra="vmas", purpose="the tests")
