"""A policy version keeps its type from the checkpoint to the model spec, and the spec is made and read in one place."""

from __future__ import annotations

import msgspec
import pytest

from hx.learner.kinds import KINDS
from hx.learner.provider import PolicyProvider
from hx.runtime.errors import ModelSpecError
from schemas.envelope import decode_body, encode_body
from schemas.identities import (
    PolicyVersion,
    fresh_policy_spec,
    is_policy,
    policy_spec,
    policy_version,
    short,
)
from schemas.learn import PolicyGated

FULL = PolicyVersion("0123456789abcdef" * 4)


def test_a_spec_names_its_version_and_reads_back() -> None:
    assert policy_spec(FULL) == f"policy:{FULL}"
    assert policy_version(policy_spec(FULL)) == FULL
    assert policy_version(policy_spec(short(FULL))) == FULL[:12]
    assert is_policy(policy_spec(FULL)) and is_policy(fresh_policy_spec("lm"))


@pytest.mark.parametrize("spec", ["policy:lm", "policy:scorer", "policy:./ckpt/a", "policy:0123abc",
                                  "random:uniform", f"openai:{FULL}", "policy:", FULL])
def test_a_spec_that_names_no_stored_version_reads_as_none(spec: str) -> None:
    assert policy_version(spec) is None


def test_the_policy_provider_accepts_every_spec_made_here() -> None:
    for spec in [policy_spec(FULL), policy_spec(short(FULL)), *(fresh_policy_spec(k) for k in KINDS)]:
        scheme, _, model = spec.partition(":")
        assert scheme == PolicyProvider.scheme
        PolicyProvider.check(model, {})
    with pytest.raises(ModelSpecError):
        PolicyProvider.check("0123abc", {})  # seven hex digits: not a version prefix


def test_a_typed_version_travels_as_the_string_it_was() -> None:
    gated = PolicyGated(run_id="r", through_round=0, candidate=FULL, parent=short(FULL), adopted=True)
    as_str = msgspec.structs.replace(gated, candidate=str(FULL), parent=str(FULL[:12]))
    assert encode_body(gated) == encode_body(as_str)
    assert decode_body(PolicyGated.TYPE, PolicyGated.VERSION, encode_body(gated)) == gated
