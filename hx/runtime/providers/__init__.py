"""Model providers behind specs like ``anthropic:claude-sonnet-4-6``.

Built-in providers are registered by scheme and their modules imported on first use:
the anthropic SDK alone takes seconds to import, and most hx commands never call a model.
"""

from hx.runtime.providers.base import (
    CallContext,
    Completion,
    ContextTooLong,
    Provider,
    ProviderError,
    make_provider,
)

__all__ = ["CallContext", "Completion", "ContextTooLong", "Provider", "ProviderError", "make_provider"]
