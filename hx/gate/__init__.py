"""The gate's decision rule: what AEGIS's deterministic gate applies, and what the audit checks every verdict by."""
