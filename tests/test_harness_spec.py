"""The typed harness a ledger event carries encodes to exactly the bytes the dict it replaced did.

Before issue 34, ``ledger.opened``, ``ledger.harness_shipped`` and ``ledger.variant_forked``
carried ``HarnessConfig.to_dict()``; a ledger's digests cover the encoded body, so the typed
``HarnessSpec`` must encode to the same bytes for every harness, or old ledgers stop verifying
and a new one is digested differently from how its writer's older self would have. ``_OldAttachment``
and ``_OldSlots`` are the classes ``to_dict`` was made from at d5fa154, kept as the reference.
"""

from __future__ import annotations

import gzip
import json
from base64 import b64decode
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

import hx.processors  # noqa: F401 - the harnesses name library processors
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harness.processor import build, registered
from hx.harnesses import families, starter_harness
from schemas.edits import Attach, Remove
from schemas.envelope import decode_message
from schemas.harness import HarnessSpec
from schemas.hooks import HookName
from schemas.ledger import HarnessShipped, LedgerOpened, VariantForked, ledger_digest

DATA = Path(__file__).parent / "data" / "pre34"
_encoder = msgspec.msgpack.Encoder(order="deterministic")  # as schemas.envelope encodes a body


class _OldSlots(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    tools: tuple[str, ...] = ()
    tracer: Literal["log", "none"] = "log"
    workspace: str = ""
    sandbox: Literal["subprocess", "none"] = "subprocess"
    plugins: tuple[str, ...] = ()


class _OldAttachment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    type: str
    hooks: tuple[HookName, ...]
    params: dict[str, Any] = {}


def _old_dict(h: HarnessConfig) -> dict[str, Any]:
    """``HarnessConfig.to_dict()`` as hx wrote it before issue 34."""
    slots = _OldSlots(**{f: getattr(h.slots, f) for f in _OldSlots.__struct_fields__})
    return {"processors": [msgspec.to_builtins(_OldAttachment(type=a.type, hooks=a.hooks, params=a.params))
                           for a in h.attachments],
            "slots": msgspec.to_builtins(slots)}


def _edited(base: HarnessConfig) -> list[HarnessConfig]:
    """``base`` after each lever an evolver pulls: every library processor attached, every group removed."""
    out = []
    for name, cls in sorted(registered().items()):
        try:
            build(name, {})
            out.append(apply(base, [Attach(processor=name, hooks=cls.accepted_hooks()[:1])]))
        except CompositionError:
            continue  # its group is taken, or it needs parameters
    out += [apply(base, [Remove(group=g)]) for g in base.groups()]
    return out


def _harnesses() -> list[HarnessConfig]:
    starters = [starter_harness(f) for f in families()]
    out = [HarnessConfig(), *starters]
    for base in starters:
        out += _edited(base)
    out.append(starters[0].with_slots(tools=("calculator",), tracer="none", workspace="/w", sandbox="none",
                                      plugins=("my.plugin",)))
    out.append(starters[0].with_slots(workspace="/only/one/slot"))
    return out


HARNESSES = _harnesses()


def test_the_harnesses_cover_the_levers() -> None:
    assert len(HARNESSES) > 40
    assert len({h.digest for h in HARNESSES}) == len(HARNESSES)


@pytest.mark.parametrize("harness", HARNESSES, ids=lambda h: h.digest[7:19])
def test_a_harness_spec_encodes_to_the_bytes_its_dict_did(harness: HarnessConfig) -> None:
    old = _old_dict(harness)
    assert _encoder.encode(harness.spec()) == _encoder.encode(old)
    assert harness.to_dict() == old
    assert [list(p) for p in harness.to_dict()["processors"]] == [list(p) for p in old["processors"]]
    assert list(harness.to_dict()["slots"]) == list(old["slots"])
    shipped = HarnessShipped(run_id="r", prev="sha256:p", round=0, variant="v0", candidates=("C-R0-01",),
                             digest_before="a", digest_after=harness.digest, operations=(), harness=harness.spec())
    as_dict = msgspec.structs.replace(shipped, harness=old)  # what the writer built before: a dict in the field
    assert ledger_digest(shipped) == ledger_digest(as_dict)
    decoded = msgspec.msgpack.decode(_encoder.encode(old), type=HarnessSpec)
    assert _encoder.encode(decoded) == _encoder.encode(old)
    assert HarnessConfig.from_spec(decoded).digest == harness.digest


def test_the_readable_order_of_to_dict_is_kept() -> None:
    # TOML files and the LLM evolver's prompt show the keys in this order.
    h = starter_harness("textworld").with_slots(tracer="none", plugins=("p",))
    assert list(h.to_dict()["processors"][0]) == ["type", "hooks", "params"]
    assert list(h.to_dict()["slots"]) == ["tracer", "plugins"]


@pytest.mark.parametrize("params", [
    {"b": 1, "a": 1.0, "c": [], "d": {}, "e": {"z": 0, "y": [1, 2.5, "x"]}, "f": None, "g": True, "h": ""},
    {"n": 3},
    {"n": 3.0},
])
def test_recorded_params_keep_their_json_exactly(params: dict[str, Any]) -> None:
    old = {"processors": [{"hooks": ["task_start"], "params": params, "type": "system_prompt_template"}],
           "slots": {}}
    body = _encoder.encode(old)
    assert _encoder.encode(msgspec.msgpack.decode(body, type=HarnessSpec)) == body


def test_every_harness_of_the_old_ledgers_decodes_to_its_stored_bytes_and_builds_its_digest() -> None:
    seen = 0
    with gzip.open(DATA / "HX_LEDGER.jsonl.gz", "rt") as f:
        for line in f:
            row = json.loads(line)
            body = b64decode(row["data"])
            for record in decode_message(row["subject"], row["seq"], row["headers"], body):
                ev = record.event
                if not isinstance(ev, LedgerOpened | HarnessShipped | VariantForked):
                    continue
                stored = msgspec.msgpack.decode(body)["harness"]
                assert _encoder.encode(ev.harness) == _encoder.encode(stored)
                built = HarnessConfig.from_spec(ev.harness)
                assert built.digest == (ev.digest_after if isinstance(ev, HarnessShipped) else ev.digest)
                assert _encoder.encode(built.spec()) == _encoder.encode(stored)
                seen += 1
    assert seen == 5  # three runs opened, two ships
