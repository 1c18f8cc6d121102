"""hx: a harness foundry for AI agents."""
