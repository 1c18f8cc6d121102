"""The eval suite: fixed tasks with deterministic criteria, one composite score with its interval (``hx eval``)."""
