"""The runtime: the run loop, hook pipelines, the tracer and model providers."""
