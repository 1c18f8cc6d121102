"""Export the pre-issue-34 compatibility fixture from a data directory written by hx at d5fa154.

Run once, with the BASE code on the path and a COPY of the data directory (starting the
embedded server writes into it)::

    cp -r /work/notes34/fx34-pristine /tmp/fx34 && cd /tmp/base34 && \
    HX_DATA_DIR=/tmp/fx34 PYTHONPATH=/tmp/base34 python3 /work/wt-types/tests/data/pre34/export.py \
        /work/wt-types/tests/data/pre34

It writes ``HX_LEDGER.jsonl.gz`` and ``HX_LEARN.jsonl.gz`` (every stored message) and
``HX_TRACE.jsonl.gz`` (the fewest messages that hold every event type the trace holds, plus the
first message of each run), one JSON object a line: ``stream``, ``seq``, ``subject``, ``headers``
and ``data`` (base64 of the bytes exactly as stored). Reads as the read-only auditor.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from schemas.envelope import decode_message
from streams.connection import connect


async def _messages(js: Any, stream: str) -> list[dict[str, Any]]:
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(stream, seq)
        out.append({"stream": stream, "seq": msg.seq, "subject": msg.subject, "headers": dict(msg.headers or {}),
                    "data": base64.b64encode(msg.data or b"").decode()})
    return out


def _types(row: dict[str, Any]) -> set[str]:
    records = decode_message(row["subject"], row["seq"], row["headers"], base64.b64decode(row["data"]))
    return {r.type for r in records}


def _cover(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Greedy set cover of the event types, smallest message first among equals; plus each run's first message."""
    types = [(_types(r), r) for r in rows]
    wanted = set().union(*(t for t, _ in types))
    chosen: dict[int, dict[str, Any]] = {}
    runs: set[str] = set()
    for t, r in types:
        run = r["subject"].split(".")[2]
        if run not in runs:
            runs.add(run)
            chosen[r["seq"]] = r
            wanted -= t
    while wanted:
        t, r = max(types, key=lambda tr: (len(tr[0] & wanted), -len(tr[1]["data"])))
        chosen[r["seq"]] = r
        wanted -= t
    return [chosen[s] for s in sorted(chosen)]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"{path.name}: {len(rows)} messages", file=sys.stderr)


async def main(out: Path) -> None:
    async with connect(auditor=True) as conn:
        for stream in ("HX_LEDGER", "HX_LEARN"):
            _write(out / f"{stream}.jsonl.gz", await _messages(conn.js, stream))
        _write(out / "HX_TRACE.jsonl.gz", _cover(await _messages(conn.js, "HX_TRACE")))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
