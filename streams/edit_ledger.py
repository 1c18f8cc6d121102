"""Where a run's edit ledger lives on ``HX_LEDGER``: its aggregate id, its subjects, each event's position.

The ledger of an evolution run is one ``eventsourcing`` aggregate of the application
``evolution``; its id is derived from the run id, so any reader finds a run's ledger with one
subject filter (``hx.ledger.evolution.events.<id>.*``) and reads nothing of another run. The
last token of each subject is the event's position in the run's ledger (the aggregate's
version: 1 for ``ledger.opened``).

>>> ledger_filter("evo-1")
'hx.ledger.evolution.events.d40720aa-cad4-56e1-bbab-59d17e69a915.*'
>>> position_of(ledger_filter("evo-1")[:-1] + "7")
7
"""

from __future__ import annotations

import uuid

from streams.eventsourcing.layout import StreamLayout

APP_NAME = "evolution"
"""The ``eventsourcing`` application every run's ledger aggregate belongs to."""
_NAMESPACE = uuid.UUID("6c1f5d0e-8f2a-4d5b-9a47-2f0c3e1b7a90")
LAYOUT = StreamLayout.on_ledger(APP_NAME)


def ledger_id(run_id: str) -> uuid.UUID:
    """The aggregate id of a run's ledger (stable: derived from the run id)."""
    return uuid.uuid5(_NAMESPACE, run_id)


def ledger_filter(run_id: str) -> str:
    """The subject filter of one run's ledger events on ``HX_LEDGER``."""
    return LAYOUT.aggregate_filter(ledger_id(run_id))


def position_of(subject: str) -> int:
    """The position in its run's ledger of the event on ``subject`` (the aggregate version it names)."""
    return LAYOUT.parse_event_subject(subject)[1]
