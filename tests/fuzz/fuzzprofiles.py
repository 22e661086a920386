"""Hypothesis profiles of the fuzz tests (a module, not a conftest.py: tests import
`conftest` by name, and a second one would shadow tests/conftest.py).

`graphfix-ci`: a bounded, deterministic run (derandomized: the same examples every
time) that the ordinary test run includes. `graphfix-fuzz`: many random examples
(GRAPHFIX_FUZZ_EXAMPLES, default 500), only for tests marked `fuzz`, which pyproject's
addopts deselect unless `-m fuzz` selects them.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("graphfix-ci", max_examples=25, deadline=None, derandomize=True,
                          database=None, suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("graphfix-fuzz",
                          max_examples=int(os.environ.get("GRAPHFIX_FUZZ_EXAMPLES", "500")),
                          deadline=None, database=None, suppress_health_check=_QUIET,
                          print_blob=True)

