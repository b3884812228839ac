"""tether: durable execution for multi-agent LLM systems.

A checkpoint log per thread_id after every super-step, crash recovery through leases with
fencing epochs, journaled calls, on embedded SQLite or on Postgres with many workers.
"""

from __future__ import annotations

from ._declared import register_type
from .agent import Agent, Command, finish, goto, receive
from .config import Settings
from .context import ADMIN_CHANNEL, Context, Message
from .deploy import Deployment, Upgrade, WorkerInfo
from .errors import (
    AppImportError,
    ConfigError,
    DefinitionError,
    DuplicateEffectKey,
    EffectError,
    InvalidState,
    LeaseLost,
    NondeterminismError,
    ResumeConflict,
    RunConflict,
    RunNotFound,
    RunPruned,
    SchemaError,
    SerializationError,
    StoreError,
    StoreUnavailable,
    TetherError,
)
from .retention import Policy as RetentionPolicy
from .retry import FailureCategory, RetryPolicy
from .runtime import Runtime
from .state import Append, append
from .types import Checkpoint, Effect, Interrupt, Run, RunError, RunStatus

__version__ = "0.1.0"

__all__ = [
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
