"""engine/text.py: stop strings across token boundaries, text held back while a stop could still
begin in it, and the final flush."""

import random

import pytest

from tensorfold.engine.text import ReplyText, advance_text, held_back


class Pieces:
    """A tokenizer whose token i decodes to pieces[i]."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def run(pieces: list[str], stops: tuple[str, ...]) -> tuple[list[str], bool]:
    """Feeds the pieces one token at a time, as the engine does; (emissions, stop hit)."""
    out, emitted = [], 0
    for k in range(1, len(pieces) + 1):
        new, emitted, hit = advance_text("".join(pieces[:k]), emitted, stops, k == len(pieces))
        out.append(new)
        if hit:
            return out, True
    return out, False


def test_held_back_is_the_longest_suffix_that_may_begin_a_stop():
    assert held_back("Hello E", ("END",)) == 1
    assert held_back("Hello EN", ("END",)) == 2
    assert held_back("Hello", ("END",)) == 0
    assert held_back("xab", ("abc", "bz")) == 2
    assert held_back("xab", ("bz",)) == 1
    assert held_back("END", ("END",)) == 0  # a whole stop is advance_text's hit


def test_a_stop_across_token_boundaries_ends_the_text_before_it():
    out, hit = run(["Hello ", "E", "N", "D", " more"], ("END",))
    assert hit and out == ["Hello ", "", "", ""]


def test_text_held_back_is_released_once_no_stop_can_begin():
    out, hit = run(["Hello ", "E", "N", "!", " bye"], ("END",))
    assert not hit and out == ["Hello ", "", "", "EN!", " bye"]


def test_the_final_token_flushes_what_was_held_back():
    out, hit = run(["Hello ", "EN"], ("END",))
    assert not hit and out == ["Hello ", "EN"]


def test_a_stop_inside_one_token_keeps_the_text_before_it():
    out, hit = run(["a", "bSTOPc"], ("STOP",))
    assert hit and "".join(out) == "ab"


def test_the_earliest_of_several_stops_wins():
    out, hit = run(["x", "yz", "w"], ("zw", "yz"))
    assert hit and "".join(out) == "x"


def test_an_overlapping_restart_of_a_stop_is_caught():
    out, hit = run(["E", "E", "N", "D"], ("END",))
    assert hit and "".join(out) == "E"


def test_an_incomplete_character_waits_for_its_next_byte():
    assert advance_text("ab\ufffd", 0, (), final=False) == ("ab", 2, False)
    assert advance_text("ab\ufffd", 2, (), final=True) == ("\ufffd", 3, False)
    assert advance_text("abc", 1, (), final=False) == ("bc", 3, False)


@pytest.mark.parametrize("seed", range(4))
def test_random_pieces_emit_exactly_the_text_before_the_first_stop(seed):
    """Whatever the token boundaries, the emissions add up to the text before the first stop,
    and nothing emitted is ever taken back (each emission extends a prefix of the answer)."""
    rng = random.Random(seed)
    alphabet = ["a", "b", "ab", "ba", "bb", "aab", "c"]
    stops = ("aba", "bbc", "cab")
    for _ in range(400):
        pieces = [rng.choice(alphabet) for _ in range(rng.randint(1, 12))]
        text = "".join(pieces)
        found = [i for i in (text.find(s) for s in stops) if i >= 0]
        want = text[: min(found)] if found else text
        out, hit = run(pieces, stops)
        assert hit == bool(found)
        if hit:  # caught at the token that completes it
            assert len(out) == next(
                k for k in range(1, len(pieces) + 1) if any(s in "".join(pieces[:k]) for s in stops)
            )
        assert "".join(out) == want, (pieces, out)


def test_reply_text_decodes_and_stops():
    tok = Pieces(["Hello", " wor", "ld", "E", "ND", "!"])
    reply, emitted = ReplyText(), []
    ids = []
    for t, final in [(0, False), (1, False), (3, False), (2, False), (3, False), (4, False)]:
        ids.append(t)
        new, hit = reply.advance(tok, ids, ("END",), final)
        emitted.append(new)
    assert hit
    assert emitted == ["Hello", " wor", "", "Eld", "", ""]
    assert reply.text == "Hello worEld" == "".join(emitted)


def test_reply_text_final_flush():
    tok = Pieces(["Hi", "E"])
    reply = ReplyText()
    assert reply.advance(tok, [0, 1], ("END",), final=False) == ("Hi", False)
    assert reply.advance(tok, [0, 1], ("END",), final=True) == ("E", False)
    assert reply.text == "HiE"
