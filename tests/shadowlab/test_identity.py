"""identity: warm-vs-cold comparison of text bytes and token ids."""

from __future__ import annotations

from shadowlab.judge import identity
from shadowlab.judge.verdicts import IdentityStatus


def test_identical_counts_only_with_reuse():
    same = identity.compare("héllo", [1, 2, 3], "héllo", [1, 2, 3], reused_tokens=2048, reference_cell="cold.C")
    assert same.status is IdentityStatus.IDENTICAL and "2048" in same.detail
    weak = identity.compare("héllo", [1, 2, 3], "héllo", [1, 2, 3], reused_tokens=0, reference_cell="cold.C")
    assert weak.status is IdentityStatus.IDENTICAL_NO_REUSE and "proves nothing" in weak.detail
    unknown = identity.compare("a", [1], "a", [1], reused_tokens=None, reference_cell="cold.C")
    assert unknown.status is IdentityStatus.IDENTICAL_NO_REUSE


def test_mismatch_reports_first_token_and_first_byte_and_both_outputs():
    warm_text, cold_text = "abcé-x", "abcé-y"
    check = identity.compare(warm_text, [97, 98, 99, 233, 45, 120], cold_text, [97, 98, 99, 233, 45, 121],
                             reused_tokens=100, reference_cell="cold.C")
    assert check.status is IdentityStatus.MISMATCH
    assert check.first_diff_token == 5
    assert check.first_diff_byte == len("abcé-".encode())  # a byte offset, not a character index
    assert (check.text, check.reference_text) == (warm_text, cold_text)
    assert check.tokens == (97, 98, 99, 233, 45, 120) and check.reference_tokens[-1] == 121


def test_same_text_different_tokens_is_a_mismatch():
    # byte-level tokenizers can spell the same text with different ids
    check = identity.compare("ab", [97, 98], "ab", [300], reused_tokens=5, reference_cell="c")
    assert check.status is IdentityStatus.MISMATCH
    assert check.first_diff_token == 0 and check.first_diff_byte is None


def test_prefix_outputs_differ_at_the_shorter_length():
    check = identity.compare("abc", [1, 2, 3], "ab", [1, 2], reused_tokens=5, reference_cell="c")
    assert (check.first_diff_token, check.first_diff_byte) == (2, 2)


def test_replacement_characters_compare_as_bytes():
    # a lone invalid byte decoded as U+FFFD on both sides is equal; a different byte is not
    assert identity.compare("\ufffd", [200], "\ufffd", [200], reused_tokens=1).status is IdentityStatus.IDENTICAL
    assert identity.compare("\ufffd", [200], "\ufffd", [201], reused_tokens=1).status is IdentityStatus.MISMATCH


def test_control_identical_and_mismatch():
    ok = identity.compare_control("x", [1], "x", [1], reference_cell="cold.C")
    assert ok.status is IdentityStatus.IDENTICAL and "cold vs cold" in ok.detail
    bad = identity.compare_control("x", [1], "y", [2], reference_cell="cold.C")
    assert bad.status is IdentityStatus.MISMATCH and "nondeterminism" in bad.detail


def test_mark_inconclusive_only_touches_mismatches():
    bad = identity.compare("a", [1], "b", [2], reused_tokens=9, reference_cell="c")
    marked = identity.mark_inconclusive(bad, "ref.control.C")
    assert marked.inconclusive and "ref.control.C" in marked.detail
    good = identity.compare("a", [1], "a", [1], reused_tokens=9, reference_cell="c")
    assert identity.mark_inconclusive(good, "ref.control.C") is good


def test_first_difference():
    assert identity.first_difference([1, 2], [1, 2]) is None
    assert identity.first_difference(b"ab", b"ax") == 1
    assert identity.first_difference([], [5]) == 0


def test_missing_token_ids_fall_back_to_text():
    # a cold chat answer recorded without token ids: the text decides, and says so
    same = identity.compare("abc", [1, 2, 3], "abc", [], reused_tokens=7, reference_cell="cold")
    assert same.status is IdentityStatus.IDENTICAL and "text only" in same.detail
    differ = identity.compare("abc", [1, 2, 3], "abd", [], reused_tokens=7, reference_cell="cold")
    assert differ.status is IdentityStatus.MISMATCH and differ.first_diff_token is None and differ.first_diff_byte == 2
    # two genuinely empty completions are identical
    assert identity.compare("", [], "", [], reused_tokens=7).status is IdentityStatus.IDENTICAL
