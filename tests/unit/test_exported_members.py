"""The public surface: `tether.__all__` is pinned, complete, sorted, and every name resolves."""

from __future__ import annotations

import types

import tether

EXPECTED = [
    "ADMIN_CHANNEL",
    "Agent",
    "AppImportError",
    "Append",
    "Checkpoint",
    "Command",
    "ConfigError",
    "Context",
    "DefinitionError",
    "Deployment",
    "DuplicateEffectKey",
    "Effect",
    "EffectError",
    "FailureCategory",
    "Interrupt",
    "InvalidState",
    "LeaseLost",
    "Message",
    "NondeterminismError",
    "ResumeConflict",
    "RetentionPolicy",
    "RetryPolicy",
    "Run",
    "RunConflict",
    "RunError",
    "RunNotFound",
    "RunPruned",
    "RunStatus",
    "Runtime",
    "SchemaError",
    "SerializationError",
    "Settings",
    "StoreError",
    "StoreUnavailable",
    "TetherError",
    "Upgrade",
    "WorkerInfo",
    "__version__",
    "append",
    "finish",
    "goto",
    "receive",
    "register_type",
]

# The names DESIGN.md marks stable: removing or renaming one breaks users.
STABLE = {"Agent", "Context", "Command", "goto", "finish", "append", "Runtime", "Run",
          "Checkpoint", "RunStatus"}


def test_all_is_pinned() -> None:
    assert tether.__all__ == EXPECTED


def test_all_imports_are_exported() -> None:
    included_private_members = ["__version__"]
    public = [
        name
        for name, value in vars(tether).items()
        if (not name.startswith("_") or name in included_private_members)
        and not isinstance(value, types.ModuleType)
        and type(value).__module__ != "__future__"  # `from __future__ import annotations`
    ]
    assert tether.__all__ == sorted(public)


def test_every_exported_name_resolves() -> None:
    for name in tether.__all__:
        assert getattr(tether, name) is not None, name


def test_stable_names_are_exported() -> None:
    assert set(tether.__all__) >= STABLE


def test_errors_share_one_base() -> None:
    errors = [getattr(tether, n) for n in tether.__all__
              if isinstance(getattr(tether, n), type) and issubclass(getattr(tether, n), Exception)]
    assert errors
    assert all(issubclass(e, tether.TetherError) for e in errors)


def test_version_is_a_string() -> None:
    assert isinstance(tether.__version__, str) and tether.__version__
