"""Byte tokenizer: round trips, specials, invalid UTF-8, validation, ChatML."""
import pytest

from shadowlab_engine import tokenizer as tok


def test_text_round_trips_byte_for_byte():
    text = "plain ascii, ünïcödé, 漢字, emoji 🙂\n\ttabs"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_special_strings_parse_as_specials_unless_disabled():
    assert tok.encode("a<|eos|>b<|im_start|>") == [97, tok.EOS, 98, tok.IM_START]
    literal = tok.encode("<|bos|>", parse_special=False)
    assert literal == list(b"<|bos|>") and tok.BOS not in literal
    assert tok.decode([tok.BOS, 104, tok.IM_END]) == "<|bos|>h<|im_end|>"
    assert tok.decode([tok.BOS, 104], render_special=False) == "h"


def test_invalid_utf8_becomes_one_replacement_char_per_bad_byte_and_ids_stay_exact():
    ids = [104, 0xFF, 105, 0xC3]          # lone 0xFF, truncated 2-byte sequence at the end
    assert tok.decode_bytes(ids) == b"h\xffi\xc3"
    assert tok.decode(ids) == "h\ufffdi\ufffd"


def test_validate_rejects_ids_outside_the_vocabulary():
    assert tok.validate([0, 255, 259]) == [0, 255, 259]
    for bad in ([260], [-1], [1.0], ["a"], [True]):
        with pytest.raises(tok.UnknownTokenError):
            tok.validate(bad)
    assert tok.validate([300], vocab_size=512) == [300]


def test_chatml_render_follows_the_documented_template():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    want = ([tok.IM_START] + list(b"system\nbe brief") + [tok.IM_END] + list(b"\n")
            + [tok.IM_START] + list(b"user\nhi") + [tok.IM_END] + list(b"\n")
            + [tok.IM_START] + list(b"assistant\n"))
    assert tok.render_chatml(msgs) == want
    assert tok.render_chatml(msgs, add_generation_prompt=False) == want[:-len(b"assistant\n") - 1]
    user_start = tok.message_starts(msgs)[0]
    assert tok.render_chatml(msgs)[user_start:user_start + 5] == [tok.IM_START] + list(b"user")
    assert tok.STOP_TOKENS == {tok.EOS, tok.IM_END}
