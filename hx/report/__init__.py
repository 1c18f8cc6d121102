"""Reports: a run as figures and one self-contained HTML page."""
