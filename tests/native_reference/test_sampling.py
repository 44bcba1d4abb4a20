"""Verification rules on fixed distributions, validation of the sampling parameters,
and the distribution of the first two generated tokens through the whole engine against
the target's exact distribution (tests/native_reference/test_distribution.py goes to
three tokens, where later draft positions and the bonus token are checked)."""

from __future__ import annotations

import math

import pytest
import torch

from specadapt.errors import UsageError
from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.faults import Fault, build_engine
from specadapt.native_reference.models import CachedLM
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer
from specadapt.native_reference.sampling import (
    SamplingParams,
    draft_q,
    greedy_verify,
    probs,
    rejection_verify,
    residual,
)

from .conftest import tiny_llama

V = 6


def chi_square_p(counts: dict, expected: dict, n: int) -> float:
    """Pearson chi-square p-value; cells with expected count < 5 are pooled, and so is
    any observed outcome missing from ``expected``. An outcome of probability 0 that was
    observed gives p = 0."""
    assert sum(counts.values()) == n
    big = [c for c in expected if expected[c] * n >= 5]
    small = [c for c in expected if expected[c] * n < 5]
    obs = [counts.get(c, 0) for c in big]
    obs.append(n - sum(obs))  # everything else, impossible outcomes included
    exp = [expected[c] * n for c in big] + [sum(expected[c] for c in small) * n]
    if exp[-1] == 0:
        if obs[-1] > 0:
            return 0.0
        obs, exp = obs[:-1], exp[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_greedy_verify_prefix_and_bonus():
    logits = torch.tensor([[0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]])  # argmax 1, 2, 0
    assert greedy_verify(logits, [1, 2]) == (2, 0)  # all accepted, bonus from the last row
    assert greedy_verify(logits, [1, 0]) == (1, 2)  # second rejected, target's choice instead
    assert greedy_verify(logits, [2, 2]) == (0, 1)


def test_top_k_top_p():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert probs(x, SamplingParams(1.0, top_k=2))[0].tolist() == pytest.approx([0.625, 0.375, 0, 0])
    assert probs(x, SamplingParams(1.0, top_p=0.7))[0].tolist() == pytest.approx([0.625, 0.375, 0, 0])
    assert probs(x, SamplingParams(1.0, top_p=0.85))[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])


def test_chi_square_counts_impossible_outcomes():
    assert chi_square_p({0: 50, 1: 50}, {0: 0.5, 1: 0.5}, 100) > 0.9
    assert chi_square_p({0: 50, 1: 49, 2: 1}, {0: 0.5, 1: 0.5}, 100) == 0.0  # 2 not expected at all
    assert chi_square_p({0: 50, 1: 49, 2: 1}, {0: 0.5, 1: 0.5, 2: 0.0}, 100) == 0.0


@pytest.mark.parametrize("kw, name", [
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=-0.1), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=math.nan), "top_p"),
    (dict(top_p=math.inf), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_k=math.inf), "top_k"),
    (dict(top_k=math.nan), "top_k"),
    (dict(top_k=True), "top_k"),
])
def test_bad_sampling_params_refused(kw, name):
    """vLLM's rules (the server answers 400): one line that names the parameter."""
    with pytest.raises(UsageError, match=f"^{name} must ") as err:
        SamplingParams(**{"temperature": 1.0, **kw})
    assert "\n" not in str(err.value)


def test_good_sampling_params_accepted():
    assert SamplingParams().greedy  # the defaults
    for kw in (dict(top_k=-1), dict(top_k=0), dict(top_k=1), dict(top_p=1.0), dict(top_p=1e-9),
               dict(temperature=0.0), dict(temperature=5.0)):
        SamplingParams(**{"temperature": 1.0, **kw})
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert probs(x, SamplingParams(1.0, top_k=-1)).tolist() == probs(x, SamplingParams(1.0)).tolist()


def test_tiny_top_p_keeps_exactly_the_top_token():
    x = torch.tensor([[0.1, 2.0, 1.999, -3.0], [5.0, 5.0 - 1e-9, 0.0, 0.0]], dtype=torch.float64)
    out = probs(x, SamplingParams(1.0, top_p=1e-9))
    assert out.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_probs_refuses_rows_without_a_distribution():
    ok = SamplingParams(1.0)
    for bad in ([[0.0, math.nan, 1.0]], [[0.0, math.inf, 1.0]], [[-math.inf] * 3]):
        with pytest.raises(ValueError, match="no distribution to sample from at row 0"):
            probs(torch.tensor(bad, dtype=torch.float64), ok)
    with pytest.raises(ValueError, match="at row 1"):  # every token masked by top_k on row 1
        probs(torch.tensor([[0.0, 1.0, 2.0], [-math.inf, -math.inf, -math.inf]]), SamplingParams(1.0, top_k=2))
    # the guard must not trip on masked entries when something is left
    assert probs(torch.tensor([[-math.inf, 0.0, 0.0]]), ok).tolist() == [[0.0, 0.5, 0.5]]


def test_replacement_bonus_and_later_positions_on_certain_rows():
    """p = (1/2, 1/2), draft token 0 one-hot: after a rejection only token 1 can come. With
    p one-hot per row (the identity): the bonus comes from the row after the last draft, and
    a later position is checked as the first one is."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    assert {rejection_verify(p, None, [0], gen) for _ in range(200)} == {(1, 0), (1, 1), (0, 1)}
    eye = torch.eye(3, dtype=torch.float64)  # row i: token i surely
    assert rejection_verify(eye, None, [0, 1], None) == (2, 2)
    assert rejection_verify(eye, None, [2], None) == (0, 0)
    assert rejection_verify(eye, None, [0, 2], None) == (1, 1)
    assert rejection_verify(eye, None, [1, 2], None) == (0, 0)
    assert rejection_verify(torch.eye(4, dtype=torch.float64), None, [0, 1, 2], None) == (3, 3)


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_single_position_is_exact(one_hot):
    """One draft position: the emitted token must follow p whatever q is."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.6, 0.1, 0.2]], dtype=torch.float64)
    n, counts = 20000, {}
    for _ in range(n):
        x = 1 if one_hot else int(torch.multinomial(q[0], 1, generator=gen))
        m, nxt = rejection_verify(p, None if one_hot else q, [x], gen)
        first = x if m == 1 else nxt
        counts[first] = counts.get(first, 0) + 1
    assert chi_square_p(counts, {i: float(p[0, i]) for i in range(4)}, n) > 1e-3


def exact_first_two(target, prompt):
    """P(t1, t2) = p(t1 | prompt) p(t2 | prompt, t1), from the target alone in float64."""
    lm = CachedLM(target)
    p1 = torch.softmax(lm.forward(prompt)[-1], -1)
    out = {}
    for t1 in range(V):
        lm.rewind(len(prompt))
        p2 = torch.softmax(lm.forward([t1])[-1], -1)
        for t2 in range(V):
            out[(t1, t2)] = float(p1[t1] * p2[t2])
    return out


def sample_first_two(engine, prompt, n):
    counts = {}
    for _ in range(n):
        toks = tuple(engine.generate(prompt, 2, SamplingParams(temperature=1.0)).tokens)
        counts[toks] = counts.get(toks, 0) + 1
    return counts


@pytest.fixture(scope="module")
def small_vocab_pair():
    # large init: peaked, clearly different distributions, so a wrong sampler is visible
    target = tiny_llama(seed=10, vocab=V, layers=1, hidden=16, init=0.6)
    draft = tiny_llama(seed=11, vocab=V, layers=1, hidden=16, init=0.6)
    return target, draft


PROMPT = [1, 4, 2]
N = 1500


@pytest.mark.parametrize("min_confidence", [0.0, 0.4])
def test_draft_model_sampling_matches_target_exactly(small_vocab_pair, min_confidence):
    """Also with the confidence stop: a rule that looks only at the draft keeps exactness."""
    target, draft = small_vocab_pair
    exact = exact_first_two(target, PROMPT)
    prop = DraftModelProposer(draft, min_confidence=min_confidence)
    counts = sample_first_two(SpecEngine(target, prop, 2, seed=123), PROMPT, N)
    assert sum(counts.values()) == N
    assert chi_square_p(counts, exact, N) > 1e-3


def test_ngram_sampling_matches_target_exactly(small_vocab_pair):
    target, _ = small_vocab_pair
    prompt = [1, 4, 2, 5, 3, 1, 4]  # the lookup proposes 2, 5 (q one-hot)
    exact = exact_first_two(target, prompt)
    engine = SpecEngine(target, NgramProposer(1, 2), 2, seed=7)
    counts = sample_first_two(engine, prompt, N)
    assert chi_square_p(counts, exact, N) > 1e-3


def test_always_accept_sampler_fails_the_same_test(small_vocab_pair):
    target, draft = small_vocab_pair
    exact = exact_first_two(target, PROMPT)
    wrong = build_engine(target, DraftModelProposer(draft), 2, Fault.parse("accept-always"), seed=123)
    n = N // 5  # the effect is large; fewer samples keep the suite fast
    counts = sample_first_two(wrong, PROMPT, n)
    assert chi_square_p(counts, exact, n) < 1e-6


def test_target_and_draft_really_differ(small_vocab_pair):
    """Precondition of the power of the tests above: q is far from p."""
    target, draft = small_vocab_pair
    p, q = exact_first_two(target, PROMPT), exact_first_two(draft, PROMPT)
    assert 0.5 * sum(abs(p[c] - q[c]) for c in p) > 0.2


# --- exact rules at their boundaries (the uniform draws fixed, so each case is certain) -----------

def fixed_uniforms(monkeypatch, values):
    """torch.rand inside rejection_verify returns ``values`` (float64): the acceptance draws."""
    def rand(n, generator=None, dtype=None, device=None):
        assert n == len(values) and dtype == torch.float64
        return torch.tensor(values, dtype=torch.float64)
    monkeypatch.setattr(torch, "rand", rand)


def test_acceptance_is_strictly_u_q_below_p(monkeypatch):
    """Draft token 0 with q = 1/2, p = 1/4: accepted iff u < p/q = 1/2."""
    p = torch.tensor([[0.25, 0.75], [1.0, 0.0]], dtype=torch.float64)  # bonus row: token 0 surely
    q = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    fixed_uniforms(monkeypatch, [0.5])
    assert rejection_verify(p, q, [0], None) == (0, 1)  # u = p/q: rejected; residual (0, 1/4) -> token 1
    fixed_uniforms(monkeypatch, [0.4999999999999999])
    assert rejection_verify(p, q, [0], None) == (1, 0)  # just below: accepted, then the bonus


def test_a_token_the_target_cannot_produce_is_never_accepted(monkeypatch):
    """p(x) = 0: rejected even at u = 0 (torch.rand can return 0)."""
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    fixed_uniforms(monkeypatch, [0.0])
    assert rejection_verify(p, None, [0], None) == (0, 1)
    assert rejection_verify(p, torch.tensor([[0.5, 0.5]], dtype=torch.float64), [0], None) == (0, 1)


def test_acceptance_uses_each_positions_own_draw_and_distributions(monkeypatch):
    """Position 1 is judged by u[1], q[1] and p[1], not by position 0's."""
    p = torch.tensor([[1.0, 0.0], [0.25, 0.75], [0.0, 1.0]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    fixed_uniforms(monkeypatch, [0.9, 0.25])
    assert rejection_verify(p, q, [0, 0], None) == (2, 1)  # 0.25 * 0.5 < 0.25: accepted; bonus from p[2]
    fixed_uniforms(monkeypatch, [0.25, 0.75])
    assert rejection_verify(p, q, [0, 0], None) == (1, 1)  # 0.75 * 0.5 >= 0.25: rejected; residual -> 1


def test_an_empty_residual_falls_back_to_p(monkeypatch):
    """q exceeds p by a rounding error only, and the draw rejects: the residual max(p - q, 0)
    is all zero, so the replacement comes from p rather than from 0/0."""
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0000000000000002]], dtype=torch.float64)
    fixed_uniforms(monkeypatch, [0.9999999999999999])  # the largest double below 1
    assert rejection_verify(p, q, [1], None) == (0, 1)


def test_draft_q_is_the_drafts_row_or_one_hot_over_the_vocabulary():
    p = torch.full((3, 4), 0.25, dtype=torch.float64)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    assert draft_q(p, q, 1, 3).tolist() == [0.4, 0.3, 0.2, 0.1]  # q's row i, whatever token was drawn
    one_hot = draft_q(p, None, 1, 2)
    assert one_hot.tolist() == [0.0, 0.0, 1.0, 0.0] and one_hot.dtype == torch.float64


def test_residual_is_the_normalised_excess_of_p_over_q():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    assert residual(p, q).tolist() == pytest.approx([1.0, 0.0, 0.0])
    q = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    assert residual(p, q).tolist() == pytest.approx([0.4 / 0.5, 0.1 / 0.5, 0.0])
    assert residual(p, p).tolist() == p.tolist()  # nothing in excess: p itself, not 0/0


def test_temperature_divides_the_logits():
    x = torch.tensor([[1.0, 0.5, -1.0, 0.0]], dtype=torch.float64)
    for t in (0.5, 2.0):
        assert probs(x, SamplingParams(t))[0].tolist() == pytest.approx(torch.softmax(x / t, -1)[0].tolist(), abs=1e-15)
    assert not SamplingParams(1e-9).greedy and SamplingParams(0.0).greedy


def test_top_p_one_is_off_even_for_a_vanishing_tail():
    """With top_p = 1 nothing is cut, not even a token whose mass rounds away in the cumsum."""
    x = torch.tensor([[0.0, -50.0, -60.0]], dtype=torch.float64)
    out = probs(x, SamplingParams(1.0, top_p=1.0))
    assert out.tolist() == torch.softmax(x, -1).tolist() and out[0, 2] > 0


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    x = torch.zeros(1, 4, dtype=torch.float64)  # 1/4 each, exactly
    kept = [int((probs(x, SamplingParams(1.0, top_p=tp)) > 0).sum()) for tp in (0.25, 0.5, 0.5000001, 0.75, 1.0)]
    assert kept == [1, 2, 3, 3, 4]  # two tokens reach 0.5 exactly: the third is not needed


def test_top_k_counts_from_one_and_the_whole_vocabulary_is_off():
    x = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64))
    assert probs(x, SamplingParams(1.0, top_k=1)).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert probs(x, SamplingParams(1.0, top_k=3))[0].tolist() == pytest.approx([4 / 9, 3 / 9, 2 / 9, 0.0])
    assert probs(x, SamplingParams(1.0, top_k=4)).tolist() == probs(x, SamplingParams(1.0)).tolist()
    assert probs(x, SamplingParams(1.0, top_k=9)).tolist() == probs(x, SamplingParams(1.0)).tolist()


def test_a_refused_row_is_named_in_the_message():
    with pytest.raises(ValueError) as err:
        probs(torch.tensor([[0.0, 1.0], [0.0, 1.0], [math.nan, 0.0]], dtype=torch.float32), SamplingParams(1.0))
    assert str(err.value).startswith("no distribution to sample from at row 2: the logits hold NaN/inf "
                                     "(a torch.float32 overflow?) or SamplingParams(")


@pytest.mark.parametrize("kw, name", [
    (dict(temperature=True), "temperature"),
    (dict(top_p=True), "top_p"),  # True == 1 would pass the range check
    (dict(top_p="0.5"), "top_p"),
    (dict(top_k="2"), "top_k"),
])
def test_booleans_and_strings_are_not_numbers(kw, name):
    with pytest.raises(UsageError, match=f"^{name} must "):
        SamplingParams(**{"temperature": 1.0, **kw})


def test_probs_are_float64_whatever_the_logits_dtype():
    """The acceptance test u*q < p runs on these: float32 or bfloat16 logits (a model in
    that dtype) still give float64 distributions."""
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.tensor([[0.3, 0.2, -0.1]], dtype=dtype)
        out = probs(x, SamplingParams(0.7, top_p=0.9))
        assert out.dtype == torch.float64
        assert out.tolist() == probs(x.to(torch.float64), SamplingParams(0.7, top_p=0.9)).tolist()


def test_one_hot_proposals_use_the_vocabulary_size():
    """q = one-hot over the V columns of p (here V = 3, k + 1 = 2 rows): a rejected draft
    token leaves the residual p - onehot(x) on every other token."""
    p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert rejection_verify(p, None, [1], None) == (0, 2)
    assert rejection_verify(p, None, [2], None) == (1, 0)


def test_every_draw_comes_from_the_requests_generator():
    """Same seed, same tokens, whatever the global RNG did meanwhile: acceptance draws,
    replacements from the residual and bonus tokens."""
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)

    def run(global_seed):
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(5)
        out = [rejection_verify(p, q, [3, 0], gen) for _ in range(60)]
        out += [rejection_verify(p, None, [], gen) for _ in range(20)]  # bonus only
        return out

    first = run(0)
    assert len({m for m, _ in first[:60]}) == 3  # rejections at 0 and 1 and full acceptance all occur
    assert run(1) == first


def test_rejection_sampling_makes_its_tensors_on_the_distributions_device_not_the_default_one():
    """On a CPU the default device is the distributions' device, so a tensor made without
    ``device=p.device`` would go unnoticed there. Here the default device is "meta" (tensors
    without data) while the distributions are on the CPU: any tensor the sampler makes on the
    default device breaks it, as a CUDA run would (the gpu-marked test below)."""
    p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        assert torch.empty(1).device.type == "meta"
        assert rejection_verify(p, None, [1], gen) == (0, 2)
        assert rejection_verify(p, None, [2], gen) == (1, 0)
        assert rejection_verify(p, q, [1], gen) == (0, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rejection_sampling_stays_on_the_distributions_device():
    p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    assert rejection_verify(p, None, [1], gen) == (0, 2)
    assert rejection_verify(p, None, [2], gen) == (1, 0)
