"""Inspect, lint, compare and show chat templates: the pre-flight checklist, automated.

* :func:`inspect` -> :class:`Report`: capabilities, output format, stop markers, special tokens,
  rejected roles, variables, prefix stability and token overhead (:mod:`.report`);
* :func:`lint` -> :class:`Finding` list: concrete risks with severities and template lines (:mod:`.linting`);
* :mod:`.compare`: two templates on the same conversations, or a template against formatted samples;
* :mod:`.page`: one self-contained HTML page of a rendered conversation.

This package sits above the core (nothing below imports it) and uses its public API.
"""

from __future__ import annotations

from .linting import Finding, lint
from .prefix import PrefixChange, PrefixStability, prefix_stability
from .report import Overhead, Report, RoleCheck, inspect

__all__ = [
    "Finding",
    "Overhead",
    "PrefixChange",
    "PrefixStability",
    "Report",
    "RoleCheck",
    "inspect",
    "lint",
    "prefix_stability",
]
