"""identity_report on multi-turn conversations: each turn of a conversation is a pair of its own
until the conversation first diverges; the turns after that have a different history. Checked
where the turn numbers exceed the concurrency (closed loop at concurrency 1, and an arrival-rate
run, whose records carry concurrency 0)."""

from __future__ import annotations

from specadapt.analysis.identity import identity_report
from specadapt.records import ChatMessage, Prompt, RequestRecord

CHAT = Prompt(id="chat", category="talk", messages=[ChatMessage(role="user", content="hi")],
              turns=["more", "again", "last"])


def turn(side: str, n: int, tokens: list[str], **kw) -> RequestRecord:
    return RequestRecord(prompt_id="chat", category="talk", api="chat", side=side, ok=True, turn=n,
                         tokens=tokens, text="".join(tokens), output_tokens=len(tokens), **kw)


def conversation(outputs: list[tuple[list[str], list[str]]], **kw) -> list[RequestRecord]:
    """Off and on records of one conversation, one (off tokens, on tokens) per turn."""
    return [r for n, (off, on) in enumerate(outputs) for r in (turn("off", n, off, **kw), turn("on", n, on, **kw))]


def triage_calls():
    seen = []

    def triage(prompt, div, off):
        seen.append((div.turn, div.token_index, div.concurrency, off.turn))
        return None
    return triage, seen


SAME = [(["a", "b"], ["a", "b"]), (["c"], ["c"]), (["d", "e"], ["d", "e"])]


def test_an_identical_conversation_is_identical_at_every_turn():
    recs = conversation(SAME, concurrency=1) + conversation(SAME, concurrency=0, request_rate=2.0)
    triage, seen = triage_calls()
    (ident,) = identity_report(recs, [CHAT], triage)
    assert (ident.pairs, ident.identical_pairs, ident.different_history_pairs) == (6, 6, 0)
    assert (ident.verdict, ident.divergence, ident.same_origin_pairs) == ("identical", None, 0)
    assert seen == []


def test_a_conversation_that_first_diverges_at_a_late_turn_is_judged_there():
    # turns 0 and 1 identical, turn 2 diverges at its token 1, turn 3 follows another history
    outputs = SAME[:2] + [(["d", "e"], ["d", "X"]), (["f"], ["g"])]
    triage, seen = triage_calls()
    (ident,) = identity_report(conversation(outputs, concurrency=1), [CHAT], triage)
    assert (ident.pairs, ident.identical_pairs, ident.different_history_pairs) == (3, 2, 1)
    assert (ident.verdict, ident.divergence.turn, ident.divergence.token_index) == ("unknown", 2, 1)
    assert seen == [(2, 1, 1, 2)]


def test_at_an_arrival_rate_a_divergence_at_turn_1_is_the_origin():
    # concurrency 0 on every record of an arrival-rate run; the identical conversation at another
    # rate keeps all its turns
    outputs = SAME[:1] + [(["c"], ["Y"]), (["d", "e"], ["h"])]
    recs = conversation(outputs, concurrency=0, request_rate=1.0) + conversation(SAME, concurrency=0,
                                                                                 request_rate=4.0)
    triage, seen = triage_calls()
    (ident,) = identity_report(recs, [CHAT], triage)
    assert (ident.pairs, ident.identical_pairs, ident.different_history_pairs) == (5, 4, 1)
    assert (ident.verdict, ident.divergence.turn, ident.divergence.token_index) == ("unknown", 1, 0)
    assert seen == [(1, 0, 0, 1)]
