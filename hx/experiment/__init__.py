"""Controlled experiments: completely randomised designs on the log and the panel that judges them."""
