"""Harness composition: processors, the HarnessConfig value, ordering and hook contracts."""
