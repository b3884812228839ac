"""Every error tether raises.

    TetherError
    ├── ConfigError                  bad settings, DB URL, or --app target
    │   └── AppImportError           the user's module cannot be imported
    ├── StoreError                   the database failed (driver error chained)
    │   ├── StoreUnavailable         cannot connect (URL shown with password redacted)
    │   └── SchemaError              schema missing or behind: run `tether migrate`
    ├── SerializationError           state, update or result not serializable
    ├── DefinitionError              an agent/node/effect is unknown or badly declared
    │   └── DuplicateEffectKey       an explicit effect key was already used in the run
    ├── RunNotFound                  no run has this thread_id
    │   └── RunPruned                the run was removed by retention (tether prune)
    ├── RunConflict                  thread_id/idempotency key exists with other input
    │   └── ResumeConflict           the interrupt was already answered
    ├── InvalidState                 the run is not in a state that allows this
    ├── EffectError                  an effect handler failed (transactional: the step too)
    ├── LeaseLost                    another worker holds the run now; commit refused
    ├── NondeterminismError          a replayed node made a different call sequence
    └── CallTimeout                  a journaled call outlived its timeout= (also a TimeoutError)

A node task whose run is cancelled or whose lease is lost receives asyncio.CancelledError
(a BaseException, so `except Exception` in user code does not swallow it).
"""

from __future__ import annotations


def with_article(name: str) -> str:
    """A type's name with its article, for messages: "an int", "a dict", "an Agent"."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class TetherError(Exception):
    """Base class of every error tether raises."""


class ConfigError(TetherError):
    """Invalid configuration: DB URL, settings, or an --app target."""


class AppImportError(ConfigError):
    """The module named by --app could not be imported or has no such attribute."""


class StoreError(TetherError):
    """The database failed; the driver's exception is chained as __cause__."""


class StoreUnavailable(StoreError):
    """The database cannot be reached."""


class SchemaError(StoreError):
    """The schema is missing or behind the code: run `tether migrate`."""


class SerializationError(TetherError):
    """A value could not be serialized; the message names the key and type."""


class DefinitionError(TetherError):
    """An agent or node is unknown or declared wrongly."""


class DuplicateEffectKey(DefinitionError):
    """An explicit effect key was used twice in one run."""


class RunNotFound(TetherError):
    """No run has this thread_id."""


class RunPruned(RunNotFound):
    """The run was removed by retention; `pruned_at` says when (seconds since the epoch)."""

    def __init__(self, message: str, *, thread_id: str, pruned_at: float) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.pruned_at = pruned_at


class RunConflict(TetherError):
    """The thread_id or idempotency key exists with a different agent or input."""


class ResumeConflict(RunConflict):
    """The interrupt was already answered (by a concurrent or earlier resume)."""


class InvalidState(TetherError):
    """The run is not in a state that allows the operation."""


class EffectError(TetherError):
    """An effect handler failed; for a transactional effect the step's commit was undone."""


class LeaseLost(TetherError):
    """The worker's lease was taken over (fencing epoch moved); nothing was committed."""


class NondeterminismError(TetherError):
    """A re-executed node made a call sequence that differs from its journal."""


class CallTimeout(TetherError, TimeoutError):
    """A journaled call took longer than its `timeout=`; retried like a provider timeout."""
