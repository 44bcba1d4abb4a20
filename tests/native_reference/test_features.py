"""Request features on every position of a verify pass: min_tokens, logit_bias, the
penalties, min_p, stop token ids and stop strings; speculation equals one token at a
time; and the planted feature faults, each visible only with multi-token chunks."""

from __future__ import annotations

import math

import pytest
import torch

from specadapt.errors import UsageError
from specadapt.native_reference.engine import Row, SpecEngine, SpecStats
from specadapt.native_reference.faults import FAULTS, FEATURE_FAULTS, Fault, build_engine
from specadapt.native_reference.proposers import NgramProposer
from specadapt.native_reference.sampling import SamplingParams, probs, process_logits
from specadapt.native_reference.stops import StopStrings

# n-gram lookup accepts long chunks on this text: the model repeats the pattern
TEXT = "a b c d e f g a b c d e f g a b c d e f g a b c d e f g"
N = 12


# -- the processing function on small tensors ------------------------------------------------

def test_penalties_and_bias_by_hand():
    """bias, then repetition (prompt or output), frequency (output count), presence."""
    logits = torch.tensor([[2.0, -1.0, 1.0, 0.5, -2.0]])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias={"3": 1.0, 4: 500})
    x = process_logits(logits, params, prompt=[0], output=[1, 1, 2])
    want = [2.0 / 2,  # in the prompt only: repetition
            -1.0 * 2 - 0.5 * 2 - 0.25,  # output twice, negative: multiplied
            1.0 / 2 - 0.5 - 0.25,  # output once
            1.5,  # bias only
            -2.0 + 100]  # bias clamped to 100
    assert x[0].tolist() == pytest.approx(want)
    assert params.logit_bias == ((3, 1.0), (4, 100.0))


def test_each_row_sees_the_drafts_before_it():
    logits = torch.zeros(3, 4)
    x = process_logits(logits, SamplingParams(frequency_penalty=1.0), [3], [0], drafts=[1, 1])
    assert x.tolist() == [[-1, 0, 0, 0], [-1, -1, 0, 0], [-1, -2, 0, 0]]
    # the draft-penalties-skipped fault's form: only the first row processed
    row = _row(SamplingParams(frequency_penalty=1.0))
    only_first = _faulty("draft-penalties-skipped")._process(row, logits, [1, 1])
    assert only_first.tolist() == [[-1, 0, 0, 0], [0] * 4, [0] * 4] and only_first.dtype == torch.float64


def _row(params: SamplingParams) -> Row:
    """A row with prompt [3] and output [0]."""
    return Row([3], 8, params, (), False, 0, torch.Generator(), 0, SpecStats(), tokens=[3, 0])


def _faulty(name: str):
    """An instance of the fault's class for calling its steps alone (no model behind it)."""
    return object.__new__(FAULTS[name])


def test_min_tokens_masks_stop_ids_until_reached():
    logits = torch.zeros(3, 4)
    x = process_logits(logits, SamplingParams(min_tokens=3), [0], [1, 1], drafts=[2, 2], stop_ids={3, 2})
    assert math.isinf(x[0, 3]) and math.isinf(x[0, 2])  # 2 generated < 3
    assert x[1:].isfinite().all()  # 3 and 4 generated


def test_temperature_then_min_p_then_top_k_then_top_p():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.06, 0.04]]))
    # min_p 0.2 drops < 0.08 (0.06, 0.04); top_k 3 keeps .4 .3 .2; top_p 0.6 of those keeps .4 .3
    p = probs(logits, SamplingParams(1.0, top_k=3, top_p=0.6, min_p=0.2))
    assert p[0].tolist() == pytest.approx([0.4 / 0.7, 0.3 / 0.7, 0, 0, 0])
    # temperature first: at T = 0.5 the probabilities are squared, so min_p 0.2 drops 0.2^2 < 0.2 x 0.4^2
    hot = probs(logits, SamplingParams(0.5, min_p=0.3))[0]
    sq = torch.tensor([0.16, 0.09, 0.04, 0.0036, 0.0016])
    assert hot.tolist() == pytest.approx([0.16 / 0.25, 0.09 / 0.25, 0, 0, 0])
    assert sq[2] < 0.3 * sq[0]
    # the draft-filters-skipped fault's form: only the first row filtered
    two = _faulty("draft-filters-skipped")._probs(_row(SamplingParams(1.0, top_k=1)), logits.repeat(2, 1))
    assert two[0].tolist() == [1, 0, 0, 0, 0] and two[1].tolist() == pytest.approx([0.4, 0.3, 0.2, 0.06, 0.04])


@pytest.mark.parametrize("kwargs, message", [
    ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2]"),
    ({"frequency_penalty": -3}, "frequency_penalty must be in [-2, 2]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number"),
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0"),
    ({"logit_bias": {"x": 1}}, "logit_bias must map token ids to numbers"),
])
def test_sampling_params_refusals(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**kwargs)


# -- the embedded model: speculation equals one token at a time ----------------------------------

@pytest.fixture(scope="module")
def smol(embedded_dir):
    from specadapt.native_reference.runtime import open_reference

    ref = open_reference(embedded_dir, ngram=True, k=4, dtype="float32")
    prompt = ref.encode(TEXT)
    return ref, prompt


def engines(ref, fault: str | None = None) -> tuple[SpecEngine, SpecEngine]:
    """(target alone, n-gram k = 4), both with ``fault``."""
    f = Fault.parse(fault) if fault else None
    return build_engine(ref.engine.model, fault=f), build_engine(ref.engine.model, NgramProposer(), 4, fault=f)


def token(ref, text: str) -> int:
    ids = ref.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, ids
    return ids[0]


def test_healthy_chunks_are_long(smol):
    ref, prompt = smol
    g = engines(ref)[1].generate(prompt, N)
    assert max(len(s.tokens) for s in g.steps) == 5


@pytest.mark.parametrize("case", ["repetition", "frequency-presence", "logit-bias", "min-tokens", "stop-token-ids",
                                  "min-p"])
def test_greedy_speculation_equals_target_alone(smol, case):
    ref, prompt = smol
    d, e = token(ref, " d"), token(ref, " e")
    params = {"repetition": SamplingParams(repetition_penalty=1.2),
              "frequency-presence": SamplingParams(frequency_penalty=0.3, presence_penalty=0.4),
              "logit-bias": SamplingParams(logit_bias={d: -100, e: 3.0}),
              "min-tokens": SamplingParams(min_tokens=3),
              "stop-token-ids": SamplingParams(),
              "min-p": SamplingParams(min_p=0.9)}[case]
    stop_token_ids = {"stop-token-ids": (d,), "min-tokens": (token(ref, " b"),)}.get(case, ())
    base, spec = engines(ref)
    a = base.generate(prompt, N, params, ref.stop_ids, stop_token_ids=stop_token_ids)
    b = spec.generate(prompt, N, params, ref.stop_ids, stop_token_ids=stop_token_ids)
    assert a.tokens == b.tokens and a.stop_reason == b.stop_reason and a.finish_reason == b.finish_reason
    if case == "logit-bias":
        assert d not in b.tokens
    if case == "stop-token-ids":
        assert b.tokens[-1] == d and b.finish_reason == "stop" and b.stop_reason == d
    if case == "min-tokens":
        # without min_tokens the row would stop at its second token, " b"
        assert len(b.tokens) > 2 and stop_token_ids[0] not in b.tokens[:3]


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_inside_a_chunk(smol, include):
    ref, prompt = smol
    base, spec = engines(ref)
    out = []
    for engine in (base, spec):
        st = StopStrings(ref.tokenizer, [" zz", " e"], include)
        out.append(engine.generate(prompt, N, stop_ids=ref.stop_ids, stops=st))
    a, b = out
    assert a.tokens == b.tokens and a.text == b.text and b.stop_reason == " e" == a.stop_reason
    assert b.text == (" a b c d e" if include else " a b c d")
    assert b.tokens[-1] == token(ref, " e")  # the completing token is kept (and counted)
    assert any(len(s.tokens) > 1 for s in b.steps)


def test_stop_strings_unit(smol):
    """Earliest end wins across stop strings; min_tokens keeps early text from matching."""
    ref, _ = smol
    ids = ref.tokenizer(" a b c d e", add_special_tokens=False)["input_ids"]
    st = StopStrings(ref.tokenizer, [" c d", " b"])
    assert st.update(ids) == (2, " b") and st.text == " a"
    st = StopStrings(ref.tokenizer, [" b"], min_tokens=2)
    assert st.update(ids) == (len(ids), None)
    st = StopStrings(ref.tokenizer, [" c"], min_tokens=2)
    assert st.update(ids) == (3, " c") and st.text == " a b"


def test_filters_on_drafted_positions_are_exact(smol):
    """top_k = 1 (or min_p = 1) leaves one token per position: sampling then equals greedy,
    drafted positions included."""
    ref, prompt = smol
    greedy = engines(ref)[0].generate(prompt, N).tokens
    for params in (SamplingParams(2.0, top_k=1), SamplingParams(2.0, min_p=1.0)):
        assert engines(ref)[1].generate(prompt, N, params, seed=3).tokens == greedy


# -- the faults -------------------------------------------------------------------------------------

def test_feature_faults_parse():
    for name in FEATURE_FAULTS:
        assert Fault.parse(name).kind == name
    with pytest.raises(UsageError, match="takes no value"):
        Fault.parse("seed-ignored=1")


def test_stop_in_chunk_fault(smol):
    ref, prompt = smol
    base, spec = engines(ref, "stop-in-chunk")
    texts = [e.generate(prompt, N, stop_ids=ref.stop_ids, stops=StopStrings(ref.tokenizer, [" e"])).text
             for e in (base, spec)]
    assert texts[0] == " a b c d"  # k = 0: healthy
    assert texts[1].startswith(" a b c d e f")  # the chunk kept whole past the stop string


def test_overrun_max_tokens_fault(smol):
    ref, prompt = smol
    base, spec = engines(ref, "overrun-max-tokens")
    assert len(base.generate(prompt, 3).tokens) == 3
    assert len(spec.generate(prompt, 3).tokens) > 3
    assert len(engines(ref)[1].generate(prompt, 3).tokens) == 3


def test_draft_penalties_skipped_fault(smol):
    ref, prompt = smol
    d = token(ref, " d")
    params = SamplingParams(logit_bias={d: -100})
    base, spec = engines(ref, "draft-penalties-skipped")
    assert d not in base.generate(prompt, N, params).tokens
    assert d in spec.generate(prompt, N, params).tokens  # a drafted " d" checked against raw logits


def test_draft_filters_skipped_fault(smol):
    ref, prompt = smol
    greedy = engines(ref)[0].generate(prompt, N).tokens
    params = SamplingParams(2.0, top_k=1)
    base, spec = engines(ref, "draft-filters-skipped")
    assert base.generate(prompt, N, params, seed=3).tokens == greedy
    assert any(spec.generate(prompt, N, params, seed=s).tokens != greedy for s in range(3))


def test_seed_ignored_fault(smol):
    ref, prompt = smol
    params = SamplingParams(1.5)
    healthy = engines(ref)[1]
    assert healthy.generate(prompt, N, params, seed=7).tokens == healthy.generate(prompt, N, params, seed=7).tokens
    base, spec = engines(ref, "seed-ignored")
    assert base.generate(prompt, N, params, seed=7).tokens == base.generate(prompt, N, params, seed=7).tokens
    runs = {tuple(spec.generate(prompt, N, params, seed=7).tokens) for _ in range(4)}
    assert len(runs) > 1


def test_logprobs_shifted_fault(smol):
    ref, prompt = smol
    truth = engines(ref)[0].generate(prompt, N, top_logprobs=1)
    truth_lp = [lp for s in truth.steps for lp in s.logprobs]
    healthy = engines(ref)[1].generate(prompt, N, top_logprobs=1)
    assert [lp for s in healthy.steps for lp in s.logprobs] == pytest.approx(truth_lp, abs=1e-4)
    base, spec = engines(ref, "logprobs-shifted")
    assert [lp for s in base.generate(prompt, N, top_logprobs=1).steps for lp in s.logprobs] == truth_lp
    bad = [lp for s in spec.generate(prompt, N, top_logprobs=1).steps for lp in s.logprobs]
    assert bad != pytest.approx(truth_lp, abs=1e-2)


def test_draft_model_q_is_processed_too(smol):
    """The target as its own draft: with the request's processing applied to the draft's
    logits as well, every draft is accepted (greedy and sampling) and greedy output equals
    the target alone."""
    from specadapt.native_reference.proposers import DraftModelProposer

    ref, prompt = smol
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, logit_bias={token(ref, " d"): -100})
    truth = engines(ref)[0].generate(prompt, 8, params).tokens
    for p in (params, SamplingParams(1.0, repetition_penalty=1.3, logit_bias={token(ref, " d"): -100})):
        spec = SpecEngine(ref.engine.model, DraftModelProposer(ref.engine.model), 3)
        g = spec.generate(prompt, 8, p, seed=1)
        assert g.stats.accepted_tokens == g.stats.draft_tokens > 0
        if p.greedy:
            assert g.tokens == truth


def test_serve_cli_takes_a_feature_fault(embedded_dir, monkeypatch):
    from click.testing import CliRunner

    from specadapt.cli import cli
    from specadapt.native_reference import server

    calls = []
    monkeypatch.setattr(server, "run_server", lambda ref, *args: calls.append(ref))
    res = CliRunner().invoke(cli, ["reference", "serve", "--ngram", "--fault", "stop-in-chunk"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert calls[0].engine.fault.kind == "stop-in-chunk"
