"""The HTTP service: `create_app(runtime)` is the FastAPI app `tether serve` runs."""

from __future__ import annotations

from .api import create_app, drain

__all__ = ["create_app", "drain"]
