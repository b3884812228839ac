"""The stores a test can run on, as pytest parameters (Postgres ones carry the `postgres`
mark). Imported from here, not from conftest: with several conftest modules on the path,
`from conftest import ...` may find the wrong one."""

from __future__ import annotations

import pytest

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
