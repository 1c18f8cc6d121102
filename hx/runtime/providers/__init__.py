"""Model providers behind specs like ``anthropic:claude-sonnet-4-6``.

Providers are the ``hx.providers`` entry points, named by scheme (hx's own are declared in
``pyproject.toml`` like any package's) and imported on first use: the anthropic SDK alone takes
seconds to import, and most hx commands never call a model.
"""

from hx.runtime.errors import ContextTooLong, ProviderError
from hx.runtime.providers.base import CallContext, Completion, Provider, make_provider
from hx.runtime.providers.resources import ProviderResources

__all__ = ["CallContext", "Completion", "ContextTooLong", "Provider", "ProviderError", "ProviderResources",
           "make_provider"]
