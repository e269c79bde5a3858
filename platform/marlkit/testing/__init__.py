"""The public conformance kit: run ``check_adapter(env)`` in your own tests."""

from __future__ import annotations

from marlkit.testing.conformance import AdapterCheckError, check_adapter

__all__ = ["AdapterCheckError", "check_adapter"]
