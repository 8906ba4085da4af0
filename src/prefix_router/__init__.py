"""prefix-router: a prefix-cache-aware OpenAI-compatible reverse proxy."""

__version__ = "0.1.0"
