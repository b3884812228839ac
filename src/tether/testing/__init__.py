"""Helpers for users' tests: `FakeLLM`, a local OpenAI- and Anthropic-compatible server
(FastAPI; needs `tether[server]`), so agents that use the real SDKs run offline and in CI."""

from __future__ import annotations

from .fake_llm import FakeLLM, Reply, ToolCall

__all__ = ["FakeLLM", "Reply", "ToolCall"]
