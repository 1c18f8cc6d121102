"""AEGIS: the harness-evolution loop (digester, planner, evolver, critic, deterministic gate) over the log."""
