"""identity.triage: why a warm turn differs from cold (issue 16), as a pure function."""

from __future__ import annotations

import pytest

from shadowlab.judge.identity import Output, TriageClass, difference, triage

COLD = Output("abcd", (97, 98, 99, 100), (((97, -0.1),), ((98, -0.2),), ((99, -0.3),), ((100, -0.4),)))
WARM = Output("abXd", (97, 98, 88, 100), (((97, -0.1),), ((98, -0.2),), ((88, -0.5),), ((100, -0.4),)))
OTHER = Output("abcY", (97, 98, 99, 89))


def test_same_output_is_no_mismatch_and_no_class():
    assert triage(COLD, COLD, COLD, COLD) is None
    assert difference(COLD, Output("abcd", (97, 98, 99, 100))) is None  # one side without logprobs


def test_warm_equal_to_its_split_control_is_split_sensitivity():
    t = triage(WARM, COLD, split_control=WARM, control=COLD)
    assert t.cls is TriageClass.SPLIT_SENSITIVITY
    assert t.warm_vs_cold.first_token == 2 and t.warm_vs_cold.tokens_at == (88, 99)
    assert t.warm_vs_cold.top_logprobs_at == (((88, -0.5),), ((99, -0.3),))
    assert "token #2 (88 vs 99)" in t.detail


def test_warm_unlike_its_split_control_is_corrupted_state():
    t = triage(WARM, COLD, split_control=COLD, control=COLD)
    assert t.cls is TriageClass.CORRUPTED_STATE
    assert t.warm_vs_split.first_token == 2


def test_cold_unlike_cold_is_nondeterminism_whatever_the_split_control():
    for split in (WARM, COLD, None):
        assert triage(WARM, COLD, split_control=split, control=OTHER).cls is TriageClass.NONDETERMINISM


@pytest.mark.parametrize("split, control, words", [
    (None, COLD, "no request sequence"),
    (COLD, None, "nondeterminism is not excluded"),
])
def test_a_missing_control_leaves_it_undetermined_and_says_which(split, control, words):
    t = triage(WARM, COLD, split_control=split, control=control,
               no_split_control="no request sequence reproduces the schedule")
    assert t.cls is TriageClass.UNDETERMINED and words in t.detail


def test_a_moved_logprob_alone_is_a_difference():
    moved = Output("abcd", COLD.tokens, (*COLD.top_logprobs[:3], ((100, -0.41),)))
    d = difference(moved, COLD)
    assert d.first_token == 3 and d.first_byte is None


def test_text_only_outputs_are_compared_by_bytes():
    t = triage(Output(":jgP;"), Output(":jgQ;"), control=Output(":jgQ;"))
    assert t.warm_vs_cold.first_token is None and t.warm_vs_cold.first_byte == 3
    assert "byte 3" in t.detail and t.cls is TriageClass.UNDETERMINED


_MATRIX = """\
version: 1
name: t
engines:
  ref: {kind: reference, model: {preset: tiny, seed: 0}}
prompts:
  A: {kind: random, tokens: 40, seed: 1}
  B: {kind: append, from: A, extra: 8, seed: 2}
sequences:
  s: [A, B]
"""


@pytest.mark.parametrize("value, allowed", [("fail", False), ("allow", True), ("[ref]", True), ("[]", False)])
def test_identity_split_sensitivity_per_engine_or_global(value, allowed):
    from shadowlab import matrix

    m = matrix.loads(_MATRIX + f"identity: {{split_sensitivity: {value}, split_controls: all}}\n")
    assert m.identity.allows_split_sensitivity("ref") is allowed and m.identity.split_controls == "all"
    assert matrix.loads(_MATRIX).identity.split_controls == "mismatch"


@pytest.mark.parametrize("bad", ["split_sensitivity: maybe", "split_sensitivity: [other]", "split_controls: some"])
def test_identity_split_keys_refuse_bad_values_by_name(bad):
    from shadowlab import matrix
    from shadowlab.errors import ShadowlabError

    with pytest.raises(ShadowlabError, match=bad.split(":")[0]):
        matrix.loads(_MATRIX + f"identity: {{{bad}}}\n")
