"""orchestration/sampling.py without servers: request bodies, vLLM's response shapes, errors, the gate.

The response shapes are vLLM 0.32's (read in vllm/entrypoints/openai/completion/protocol.py and
checked against a live server): ``prompt_logprobs`` is a list with None for the first prompt
token, then per position ``{"<id>": {"logprob", "rank", "decoded_token"}}`` holding the top K
and, when it is not among them, the token at that position with its own rank.
"""
from __future__ import annotations
import asyncio
import json
import math
import httpx
import numpy as np
import pytest
from specadapt.adapters.base import TokenRequests
from specadapt.analysis import features as F
from specadapt.analysis import sampling_check as C
from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.analysis.sides import side_notes
from specadapt.errors import NotAServer, ServerError, ServerUnreachable, UsageError
from specadapt.orchestration import reference_target as T
from specadapt.orchestration import sampling as S
from specadapt.orchestration import sampling_requests as R
from specadapt.records import AcceptanceSummary, ChatMessage, Prompt, ServerInfo
from specadapt.records.sampling import SamplingStats, SamplingTest
from specadapt.records.sampling_report import SamplingSettings
from specadapt.wire import openai as W
import datetime
import ipaddress
import re
import shutil
import ssl
import sys
import types
from specadapt.errors import MissingDependency, UsageError
from specadapt.models import embedded_model_dir
from specadapt.wire.http import Wire

CHAT = Prompt(id="chat", messages=[ChatMessage(role="user", content="Copy: a b c")])
TEXT = Prompt(id="text", prompt="1, 2, 3,", max_tokens=5)
# vLLM 0.32's answer to prompt_logprobs=25 on a server with the default --max-logprobs
REFUSED_K = ("Requested prompt logprobs of 25, which is greater than max allowed: 20 "
             "(parameter=prompt_logprobs, value=25)")


class FakeServer:
    base_url = "http://fake:8000"
    model_id = "m"
    verify = True

    def headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer k"}


def entry(logprob: float, rank: int) -> dict:
    return {"logprob": logprob, "rank": rank, "decoded_token": "x"}


# --- request bodies ---------------------------------------------------------------------------------
def test_tokenize_body_applies_the_chat_template_with_the_generation_prompt():
    assert W.tokenize_body(CHAT, "m") == {"model": "m", "messages": [{"role": "user", "content": "Copy: a b c"}],
                                          "add_generation_prompt": True}
    assert W.tokenize_body(TEXT, "m") == {"model": "m", "prompt": "1, 2, 3,"}


def test_a_sample_is_drawn_from_the_raw_distribution_with_its_own_seed_and_no_stop_at_eos():
    assert R.sample_body((5, 6, 7), "m", 32, 41) == {
        "model": "m", "prompt": [5, 6, 7], "max_tokens": 32, "temperature": 1.0, "top_p": 1.0, "seed": 41,
        "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True, "stream": False}


def test_scoring_asks_the_prompt_logprobs_of_prompt_plus_sample_for_one_token():
    sample = C.Sample(prompt_id="p", index=0, seed=0, prompt_ids=(1, 2), tokens=(9, 8))
    assert R.score_body(sample, "m", 7) == {"model": "m", "prompt": [1, 2, 9, 8], "max_tokens": 1,
                                            "temperature": 0.0, "prompt_logprobs": 7, "return_token_ids": True,
                                            "stream": False}


def test_the_bodies_carry_the_keys_the_backend_declares_instead_of_vllm_s():
    asked = TokenRequests(sampled_ids={"ids_please": 1}, prompt_logprobs={"echo_ids": True, "full_vocab": True})
    body = R.sample_body((5,), "m", 4, 1, asked)
    assert body["ids_please"] == 1 and "return_tokens_as_token_ids" not in body and body["logprobs"] == 0
    sample = C.Sample(prompt_id="p", index=0, seed=0, prompt_ids=(1,), tokens=(2,))
    body = R.score_body(sample, "m", 3, asked)
    assert body["echo_ids"] is True and body["full_vocab"] is True and "return_token_ids" not in body
    assert body["prompt_logprobs"] == 3
    with pytest.raises(NotAServer) as err:
        R.parse_sample({"choices": [{"logprobs": {"tokens": ["a"]}}]}, asked)
    assert str(err.value) == ("the spec-on server returned token 'a', not 'token_id:N': it must honour 'ids_please' "
                              "(vLLM does)")


@pytest.mark.parametrize("requests, scoring, refusal", [
    (TokenRequests(), True, None),
    (TokenRequests(prompt_logprobs=None), False, None),  # --reference scores: no prompt logprobs needed
    (TokenRequests(prompt_logprobs=None), True, "--sampling scores the samples with the spec-off server's prompt "
                                                "logprobs, which backend b cannot return: give --reference DIR to "
                                                "recompute them from the target"),
    (TokenRequests(sampled_ids=None), False, "--sampling needs the sampled token ids, which backend b cannot return: "
                                             "run it on a backend that can (specadapt backends --json lists "
                                             "token_requests)"),
])
def test_a_backend_that_cannot_answer_is_refused_in_one_line(requests, scoring, refusal):
    if refusal is None:
        R.check_token_requests("b", requests, scoring)
        return
    with pytest.raises(UsageError) as err:
        R.check_token_requests("b", requests, scoring)
    assert str(err.value) == refusal


def test_every_sample_has_its_own_seed_base_plus_index():
    inputs = C.inputs_for([CHAT, TEXT], [[1], [2, 3]], max_tokens=16)
    plan = C.plan_samples(inputs, samples=3, seed=100)
    assert [(inp.prompt.id, i, seed) for inp, i, seed in plan] == [
        ("chat", 0, 100), ("chat", 1, 101), ("chat", 2, 102), ("text", 3, 103), ("text", 4, 104), ("text", 5, 105)]
    assert [inp.max_tokens for inp in inputs] == [16, 5]  # a prompt's own max_tokens wins
    assert inputs[1].ids == (2, 3)


# --- parsing -------------------------------------------------------------------------------------------
def test_tokenize_answer_must_hold_token_ids():
    assert W.parse_tokenize({"count": 3, "tokens": [1, 2, 3]}) == [1, 2, 3]
    for bad in ({"count": 0}, {"tokens": []}, {"tokens": ["a"]}, [1, 2]):
        with pytest.raises(NotAServer, match="no list of token ids"):
            W.parse_tokenize(bad)


def test_sampled_ids_come_from_the_token_id_logprobs():
    data = {"choices": [{"text": "ab", "finish_reason": "length",
                         "logprobs": {"tokens": ["token_id:3681", "token_id:30"], "token_logprobs": [-5.9, -2.1]}}]}
    assert R.parse_sample(data) == ([3681, 30], "length")


@pytest.mark.parametrize("data, message", [
    ({"choices": []}, "answered without a choice"),
    ({"choices": [{"text": "a", "logprobs": None}]}, "returned no logprobs tokens"),
    ({"choices": [{"text": "a", "logprobs": {"tokens": ["He"]}}]}, "returned token 'He', not 'token_id:N'"),
])
def test_a_spec_on_answer_without_token_ids_is_refused(data, message):
    with pytest.raises(NotAServer, match=message):
        R.parse_sample(data)


def test_the_head_is_ranks_1_to_k_and_drops_the_token_vllm_adds_below_it():
    entries = {11: (-0.5, 1), 12: (-1.0, 2), 13: (-2.0, 3), 99: (-9.0, 4)}
    assert R.top_k_of(entries, 3) == {11: -0.5, 12: -1.0, 13: -2.0}
    assert R.top_k_of(entries, 4) == {11: -0.5, 12: -1.0, 13: -2.0, 99: -9.0}


def test_without_ranks_the_head_is_the_k_most_likely_ties_by_id():
    entries = {5: (-1.0, None), 3: (-1.0, None), 8: (-0.1, None), 1: (-4.0, None)}
    assert R.top_k_of(entries, 2) == {8: -0.1, 3: -1.0}
    assert R.top_k_of(entries, 3) == {8: -0.1, 3: -1.0, 5: -1.0}


def scored(prompt_ids=(1, 2, 3), tokens=(7, 9), echo=None, plps=None):
    sample = C.Sample(prompt_id="p", index=4, seed=4, prompt_ids=tuple(prompt_ids), tokens=tuple(tokens))
    if plps is None:
        plps = [None, {"2": entry(-3.0, 9), "40": entry(-0.2, 1), "41": entry(-2.0, 2)},
                {"3": entry(-1.0, 1), "40": entry(-1.5, 2)},
                {"7": entry(-0.1, 1), "8": entry(-3.0, 2)},  # the first sampled token, in the top 2
                {"9": entry(-6.5, 31), "5": entry(-0.3, 1), "6": entry(-1.9, 2)}]  # outside: vLLM adds it
    choice = {"text": "", "prompt_logprobs": plps,
              "prompt_token_ids": list(echo if echo is not None else [*prompt_ids, *tokens])}
    return {"choices": [choice]}, sample


def test_one_draw_per_sampled_token_from_the_positions_after_the_prompt():
    data, sample = scored()
    draws = R.parse_scores(data, sample, k=2)
    assert draws == [TokenDraw(top={7: -0.1, 8: -3.0}, token=7, logprob=-0.1, position=0, prompt_id="p"),
                     TokenDraw(top={5: -0.3, 6: -1.9}, token=9, logprob=-6.5, position=1, prompt_id="p")]


def test_the_source_must_have_scored_exactly_the_ids_sent():
    data, sample = scored(echo=[1, 2, 3, 7, 8])
    with pytest.raises(NotAServer, match="first at position 4 of 5"):
        R.parse_scores(data, sample, k=2)
    data, sample = scored(tokens=(7, 4))  # the dict at the second sampled position does not hold 4
    data["choices"][0].pop("prompt_token_ids")
    with pytest.raises(NotAServer, match="do not hold the sampled token 4"):
        R.parse_scores(data, sample, k=2)


def test_prompt_logprobs_of_the_wrong_length_or_shape_are_refused():
    data, sample = scored()
    data["choices"][0]["prompt_logprobs"] = data["choices"][0]["prompt_logprobs"][:-1]
    with pytest.raises(NotAServer, match="returned 4 prompt logprobs for a prompt of 5 tokens"):
        R.parse_scores(data, sample, k=2)
    data, sample = scored()
    data["choices"][0]["prompt_logprobs"][3] = {"7": "high"}
    with pytest.raises(NotAServer, match="are not"):
        R.parse_scores(data, sample, k=2)


def test_a_source_without_prompt_logprobs_is_told_to_use_reference():
    data, sample = scored()
    data["choices"][0].pop("prompt_logprobs")
    with pytest.raises(NotAServer, match=r"returned no 'prompt_logprobs'.*--reference DIR"):
        R.parse_scores(data, sample, k=2)


def test_refused_k_is_recognised_from_vllms_message_only():
    assert R.refuses_k(REFUSED_K)
    assert R.refuses_k("Requested sample logprobs of 30, which is greater than max allowed: 20")
    assert not R.refuses_k("This model's maximum context length is 2048 tokens")
    assert not R.refuses_k("prompt_logprobs must be a positive value or -1")


def test_the_servers_own_error_sentence_is_kept_on_one_line():
    vllm = httpx.Response(400, json={"error": {"message": REFUSED_K, "type": "BadRequestError", "code": 400}})
    assert W.error_message(vllm.content) == REFUSED_K
    assert W.error_message(httpx.Response(400, json={"detail": "Not Found"}).content) == "Not Found"
    assert W.error_message(httpx.Response(502, text="bad\n  gateway").content) == "bad gateway"
    assert W.error_message(httpx.Response(500, text="").content) == "no detail"


# --- HTTP, with the requests answered here ----------------------------------------------------------------
def sample_answer(n_tokens: int) -> dict:
    return {"choices": [{"text": "", "finish_reason": "length",
                         "logprobs": {"tokens": [f"token_id:{t}" for t in range(n_tokens)]}}]}


def test_samples_carry_distinct_seeds_and_never_exceed_the_concurrency():
    bodies, in_flight, most = [], [0], [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer k"
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        for _ in range(3):
            await asyncio.sleep(0)
        in_flight[0] -= 1
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json=sample_answer(body["max_tokens"]))

    inputs = C.inputs_for([CHAT, TEXT], [[1, 2], [3]], max_tokens=4)
    samples = asyncio.run(S.draw_samples(FakeServer(), inputs, 5, 7, 3, 10, transport=httpx.MockTransport(handler)))
    assert most[0] == 3
    assert sorted(b["seed"] for b in bodies) == list(range(7, 17))
    assert all(b["temperature"] == 1.0 and b["top_p"] == 1.0 and b["ignore_eos"] for b in bodies)
    assert [(s.prompt_id, s.seed, len(s.tokens)) for s in samples] == (
        [("chat", 7 + i, 4) for i in range(5)] + [("text", 12 + i, 5) for i in range(5)])
    assert samples[0].prompt_ids == (1, 2) and samples[0].tokens == (0, 1, 2, 3)


def score(handler, k=25):
    sample = C.Sample(prompt_id="p", index=0, seed=0, prompt_ids=(1,), tokens=(2,))
    return asyncio.run(S.score_on_server(FakeServer(), [sample], k, 1, 10, transport=httpx.MockTransport(handler)))


def test_a_refused_k_is_one_line_saying_how_to_fix_it():
    refuse = lambda r: httpx.Response(400, json={"error": {"message": REFUSED_K}})  # noqa: E731
    with pytest.raises(UsageError) as err:
        score(refuse)
    assert str(err.value) == (f"the source server refused prompt_logprobs=25 ({REFUSED_K}): lower --top-logprobs, "
                              "or start vLLM with --max-logprobs 25 or more")


def test_other_refusals_and_dead_servers_are_server_errors():
    with pytest.raises(ServerError, match=r"HTTP 404: Not Found\); it needs prompt_logprobs"):
        score(lambda r: httpx.Response(404, json={"detail": "Not Found"}))

    def dead(request):
        raise httpx.ConnectError("Connection refused", request=request)

    with pytest.raises(ServerUnreachable, match="cannot be reached .*ConnectError: Connection refused"):
        score(dead)
    with pytest.raises(NotAServer, match="not JSON"):
        score(lambda r: httpx.Response(200, text="<html>"))


def test_tokenize_refused_points_at_reference():
    def handler(request):
        return httpx.Response(404, json={"detail": "Not Found"})

    with pytest.raises(ServerError, match=r"refused POST /tokenize for prompt 'chat' \(HTTP 404: Not Found\).*"
                                          r"--reference DIR"):
        asyncio.run(S.tokenize_on_server(FakeServer(), [CHAT], 10, transport=httpx.MockTransport(handler)))


# --- counts, notes, the gate -------------------------------------------------------------------------------
def stats(status: str, **kw) -> SamplingStats:
    base = dict(status=status, passed=status == "consistent", n_tokens=512, min_tokens=100, alpha=0.01,
                per_test_alpha=0.01 / 3, power=0.8, bins=20, seed=0, pit_histogram=[0] * 20,
                pit_expected_per_bin=25.6, rank_categories=[], summary="s")
    return SamplingStats(**{**base, **kw})


def test_the_gate_passes_only_a_consistent_verdict():
    assert C.sampling_gate(stats("consistent")).passed
    few = C.sampling_gate(stats("too-few", n_tokens=60))
    assert not few.passed and few.reasons == [
        "too few tokens to decide: 60 sampled, 100 needed; raise --samples, --max-tokens or the number of prompts"]
    tests = [SamplingTest(name="pit-ks", statistic=0.1, p_value=0.5, rejected=False),
             SamplingTest(name="rank-chi-square", statistic=40, dof=4, p_value=1.234e-6, rejected=True)]
    bad = C.sampling_gate(stats("inconsistent", tests=tests, zero_probability_tokens=2))
    assert not bad.passed and bad.reasons == [
        "the samples are not from the target distribution (rank-chi-square p=1.23e-06; 2 sampled token(s) of "
        "probability zero under the source)"]


def test_counts_per_prompt_and_tokens_in_the_head():
    inputs = C.inputs_for([CHAT, TEXT], [[1, 2, 3], [4]], 8)
    samples = [C.Sample("chat", 0, 0, (1, 2, 3), (5, 6)), C.Sample("text", 1, 1, (4,), (7,)),
               C.Sample("chat", 2, 2, (1, 2, 3), (8,))]
    draws = [[TokenDraw(top={5: -0.1}, token=5), TokenDraw(top={1: -0.1}, token=6)],
             [TokenDraw(top={7: -0.1}, token=7)], [TokenDraw(top={8: -1.0}, token=8)]]
    counts = C.prompt_counts(inputs, samples, draws)
    assert [(c.prompt_id, c.prompt_tokens, c.samples, c.tokens, c.in_top_k) for c in counts] == [
        ("chat", 3, 2, 3, 2), ("text", 1, 1, 1, 1)]


def acceptance(**kw) -> AcceptanceSummary:
    return AcceptanceSummary(**{"known": True, "drafts": 10, "draft_tokens": 40, **kw})


def test_notes_say_when_speculation_was_not_exercised_or_samples_stopped_early():
    ok = C.sampling_notes(acceptance(accepted_tokens=3), [C.Sample("p", 0, 0, (1,), (2,), "length")])
    assert len(ok) == 1 and ok[0].startswith("sampled at temperature 1 and top_p 1")
    none = C.sampling_notes(acceptance(accepted_tokens=0), [])
    assert "accepted no draft token" in none[1]
    unknown = AcceptanceSummary(known=False, reason="no counters")
    assert "unknown (no counters)" in C.sampling_notes(unknown, [])[1]
    assert len(C.sampling_notes(unknown, [], spec_looks_off=True)) == 1
    stopped = C.sampling_notes(None, [C.Sample("p", 0, 0, (1,), (2,), "stop")] * 2)
    assert stopped[1].startswith("2 sample(s) ended before max_tokens (stop)")


def test_side_notes_flag_speculation_on_the_wrong_side_and_other_models():
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="a", spec_enabled=False)
    off = ServerInfo(backend="vllm", base_url="http://off", model_id="b", spec_enabled=True)
    notes = side_notes(off, on)
    assert notes[:3] == ["the spec-off server has spec-decode counters: speculation looks ON there",
                         "the spec-on server has no spec-decode counters: speculation looks OFF there",
                         "the servers serve different model ids (b vs a)"]
    same = ServerInfo(backend="vllm", base_url="http://on", model_id="a", spec_enabled=True)
    assert side_notes(None, same) == []


# --- the whole verdict on simulated samplers ---------------------------------------------------------------
def simulated(n_samples: int, temperature: float, seed: int = 3, chain_seed: int = 99):
    """Samples of a fixed 30-token Markov chain (``chain_seed``) and the source's top 10, as the probe
    would get them."""
    rng = np.random.default_rng(seed)
    table = np.random.default_rng(chain_seed).normal(size=(30, 30)) * 2
    samples, draws = [], []
    for i in range(n_samples):
        prev, tokens, ds = 0, [], []
        for j in range(16):
            logits = table[prev]
            p = np.exp(logits - logits.max())
            p /= p.sum()
            q = p ** (1 / temperature)
            tok = int(rng.choice(30, p=q / q.sum()))
            order = np.argsort(-p)[:10]
            ds.append(TokenDraw(top={int(t): math.log(p[t]) for t in order}, token=tok, logprob=math.log(p[tok]),
                                position=j, prompt_id="p"))
            tokens.append(tok)
            prev = tok
        samples.append(C.Sample("p", i, i, (0,), tuple(tokens)))
        draws.append(ds)
    return samples, draws


def settings(**kw) -> SamplingSettings:
    return SamplingSettings(**{"samples": 32, "max_tokens": 16, "alpha": 0.01, "top_logprobs": 10, "concurrency": 4,
                               "seed": 0, "request_timeout_s": 60, "source": "server",
                               "tokenizer": "the spec-off server's /tokenize", **kw})


@pytest.mark.parametrize("temperature, status", [(1.0, "consistent"), (0.6, "inconsistent")])
def test_the_report_passes_the_target_and_fails_another_temperature(temperature, status):
    samples, draws = simulated(32, temperature)
    inputs = C.inputs_for([Prompt(id="p", prompt="x")], [[0]], 16)
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    off = ServerInfo(backend="vllm", base_url="http://off", model_id="m", spec_enabled=False)
    report = C.sampling_report(settings(), on, off, inputs, samples, draws, acceptance(accepted_tokens=5))
    assert report.stats.status == status and report.stats.n_tokens == 512
    assert report.gate.passed is (status == "consistent")
    assert report.prompts[0].tokens == 512
    assert report.source == "the spec-off server's prompt_logprobs at http://off, top 10"


def test_the_reference_source_is_named_in_the_report():
    s = settings(source="reference", reference="/models/t")
    assert C.source_text(s, None) == "the target recomputed in float64 from /models/t (--reference), top 10"


def test_reference_needs_a_model_directory(tmp_path):
    with pytest.raises(UsageError, match="is not a local HF model directory"):
        T.ReferenceTarget(tmp_path)


def test_reference_scores_each_sampled_position_with_the_logits_before_it(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    ref = T.ReferenceTarget(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    # two samples of one prompt (its KV cache reused), one of another, the first prompt again
    samples = [C.Sample("p", 0, 0, (3, 4, 5), (6, 7, 8)), C.Sample("p", 1, 1, (3, 4, 5), (9, 6, 6)),
               C.Sample("q", 2, 2, (10, 11), (12,)), C.Sample("p", 3, 3, (3, 4, 5), (1, 2))]
    for sample, draws in zip(samples, S.score_on_reference(ref, samples, k=4)):
        ids = [*sample.prompt_ids, *sample.tokens]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
        assert len(draws) == len(sample.tokens)
        for j, d in enumerate(draws):
            row = logp[len(sample.prompt_ids) - 1 + j]  # the logits at the token before sampled position j
            assert d.position == j and d.token == sample.tokens[j] and d.prompt_id == sample.prompt_id
            assert d.logprob == pytest.approx(float(row[sample.tokens[j]]), abs=1e-9)
            best = torch.topk(row, 4)
            assert d.top == pytest.approx({int(t): float(v) for t, v in zip(best.indices, best.values)}, abs=1e-9)


# --- rendering ----------------------------------------------------------------------------------------------
def report_with(st: SamplingStats):
    from specadapt.records.sampling_report import PromptTokens, SamplingReport

    on = ServerInfo(backend="vllm", base_url="http://on", version="0.32.0", model_id="m", spec_enabled=True,
                    num_speculative_tokens=4)
    return SamplingReport(settings=settings(), on_server=on, source_server=None, source="src", stats=st,
                          prompts=[PromptTokens(prompt_id="p", category="c", prompt_tokens=3, samples=32, tokens=512,
                                                in_top_k=500)],
                          acceptance=acceptance(accepted_tokens=10, acceptance_rate=0.25, mean_acceptance_length=2.0),
                          gate=C.sampling_gate(st))


def test_histogram_bar_scales_to_the_fullest_bin():
    from specadapt.report.sampling_render import histogram_bar

    assert histogram_bar([0, 5, 10, 1]) == " ▄█▁"
    assert histogram_bar([0, 0]) == "" and histogram_bar([]) == ""


def test_power_lines_state_alpha_the_detectable_tv_and_the_tokens_needed():
    from specadapt.records.sampling import TvTarget
    from specadapt.report.sampling_render import power_lines

    tests = [SamplingTest(name="pit-ks", statistic=0.1, p_value=0.5, rejected=False)] * 3
    st = stats("consistent", tests=tests, detectable_tv=0.1251, samples_needed=[
        TvTarget(tv=0.01, samples_needed=79960), TvTarget(tv=0.05, samples_needed=3199)])
    assert power_lines(report_with(st)) == [
        "false-alarm rate: alpha = 0.01 family-wise (over 3 tests, each at 0.00333): a correct server fails about "
        "1 run in 100",
        "power: with 512 tokens this run catches a PIT total-variation distance of 0.125 or more with 80% probability",
        "tokens needed at 80% power: TV 0.01: 79,960, TV 0.05: 3,199"]
    assert power_lines(report_with(stats("too-few", n_tokens=0)))[0].endswith(
        "(no test was run): a correct server fails about 1 run in 100")


def test_junit_fails_rejected_tests_zero_probability_tokens_and_too_few():
    from junitparser import JUnitXml

    from specadapt.report.sampling_render import to_junit, to_markdown

    tests = [SamplingTest(name="pit-chi-square", statistic=50, dof=19, p_value=1e-4, rejected=True),
             SamplingTest(name="pit-ks", statistic=0.01, p_value=0.9, rejected=False)]
    bad = report_with(stats("inconsistent", tests=tests, zero_probability_tokens=1))
    cases = [c for suite in JUnitXml.fromstring(to_junit(bad)) for c in suite]
    assert [(c.name, bool(c.result)) for c in cases] == [
        ("pit-chi-square", True), ("pit-ks", False), ("zero-probability-tokens", True)]
    assert "p = 0.0001 (per-test alpha 0.00333)" in cases[0].result[0].message
    few = report_with(stats("too-few", n_tokens=50))
    cases = [c for suite in JUnitXml.fromstring(to_junit(few)) for c in suite]
    assert [(c.name, bool(c.result)) for c in cases] == [("zero-probability-tokens", False), ("sample-size", True)]
    md = to_markdown(bad)
    assert "**Gate: FAIL** - the samples are not from the target distribution" in md
    assert "| pit-chi-square | 50 | 19 | 0.0001 | **yes** |" in md and "| `p` | 3 | 32 | 512 | 500 |" in md


# --- exact messages and the remaining branches (mutation testing) -----------------------------------------
def test_spec_on_refusals_name_what_is_missing_exactly():
    with pytest.raises(NotAServer) as err:
        R.parse_sample({"choices": [{"text": "", "logprobs": {"tokens": []}}]})
    assert str(err.value) == ("the spec-on server returned no logprobs tokens: it must honour 'logprobs' and "
                              "'return_tokens_as_token_ids' (vLLM does)")
    with pytest.raises(NotAServer) as err:
        R.parse_sample({"choices": [{"text": "", "logprobs": {"tokens": ["token_id:1", 7]}}]})
    assert str(err.value) == ("the spec-on server returned token 7, not 'token_id:N': it must honour "
                              "'return_tokens_as_token_ids' (vLLM does)")
    with pytest.raises(NotAServer) as err:
        R.parse_sample({})
    assert str(err.value) == ("the spec-on server answered without a choice (no 'choices[0]' object): not an "
                              "OpenAI-compatible completion")


def test_score_errors_say_where_exactly():
    data, sample = scored()
    data["choices"][0]["prompt_logprobs"][4] = {}
    with pytest.raises(NotAServer) as err:
        R.parse_scores(data, sample, k=2)
    assert str(err.value) == "the source server gave no prompt logprobs at sampled position 1 of prompt 'p' (sample 4)"
    data, sample = scored()
    data["choices"][0]["prompt_logprobs"][3] = {"7": {"rank": 1}}
    with pytest.raises(NotAServer) as err:
        R.parse_scores(data, sample, k=2)
    assert str(err.value) == ("the source server's prompt logprobs at sampled position 0 of prompt 'p' (sample 4) "
                              "are not {token id: {'logprob': ...}}")
    data, sample = scored(echo=[1, 2, 3, 7])  # echoed fewer ids than were sent, all equal
    with pytest.raises(NotAServer) as err:
        R.parse_scores(data, sample, k=2)
    assert str(err.value) == ("the source server's prompt differs from the ids sent (first at position 4 of 5): it "
                              "must take the prompt as token ids")
    data, sample = scored()
    data["choices"][0]["prompt_logprobs"] = {"0": None}
    with pytest.raises(NotAServer) as err:
        R.parse_scores(data, sample, k=2)
    assert str(err.value) == "the source server returned no list of prompt logprobs for a prompt of 5 tokens"
    data, sample = scored()
    data["choices"][0].pop("prompt_logprobs")
    with pytest.raises(NotAServer) as err:
        R.parse_scores(data, sample, k=2)
    assert str(err.value) == ("the source server returned no 'prompt_logprobs': it cannot be the source of the "
                              "target's distribution (vLLM and `specadapt reference serve` can; or give --reference "
                              "DIR)")
    with pytest.raises(NotAServer) as err:
        R.parse_scores({"choices": []}, sample, k=2)
    assert str(err.value) == ("the source server answered without a choice (no 'choices[0]' object): not an "
                              "OpenAI-compatible completion")


def test_the_servers_ranks_decide_ties_and_plain_logprobs_are_read_too():
    # ranks 2 and 3 tie: the head is the server's rank 2 (id 30), not the smaller id
    plps = [None, {"2": entry(-1.0, 1)}, {"3": entry(-1.0, 1)},
            {"11": entry(-0.5, 1), "30": entry(-1.0, 2), "12": entry(-1.0, 3), "7": entry(-5.0, 9)},
            {"9": -0.2, "5": -0.3, "6": -4.0}]  # a server that gives bare log-probabilities, no ranks
    data, sample = scored(plps=plps)
    first, second = R.parse_scores(data, sample, k=2)
    assert first.top == {11: -0.5, 30: -1.0} and first.logprob == -5.0
    assert second.top == {9: -0.2, 5: -0.3} and second.logprob == -0.2


def test_error_message_forms():
    assert W.error_message(httpx.Response(400, json={"error": "plain"}).content) == "plain"
    assert W.error_message(httpx.Response(400, json={"object": "error", "message": "old form"}).content) == "old form"
    assert W.error_message(httpx.Response(400, json={"error": {"message": "x" * 400}}).content) == "x" * 300


def test_refused_k_by_either_vllm_sentence():
    assert R.refuses_k("Requested sample logprobs of 30, which is greater than 20")
    assert R.refuses_k("Set max_logprobs (--max-logprobs) to at least 30.")


def test_only_a_400_is_read_as_a_refused_k_and_the_source_is_named():
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        return httpx.Response(500, json={"error": {"message": REFUSED_K}})

    with pytest.raises(ServerError) as err:
        score(handler)
    assert not isinstance(err.value, UsageError) and bodies[0]["model"] == "m"
    assert str(err.value) == (f"the source server refused a prompt-logprobs request (HTTP 500: {REFUSED_K}); it "
                              "needs prompt_logprobs as vLLM has them, or give --reference DIR")

    def dead(request):
        raise httpx.ConnectError("Connection refused", request=request)

    with pytest.raises(ServerUnreachable) as err:
        score(dead)
    assert str(err.value) == ("the source server at http://fake:8000 cannot be reached (ConnectError: Connection "
                              "refused)")


def test_counts_need_one_draw_list_per_sample():
    inputs = C.inputs_for([TEXT], [[4]], 8)
    with pytest.raises(ValueError):
        C.prompt_counts(inputs, [C.Sample("text", 0, 0, (4,), (7,))], [])


def test_notes_exactly():
    first = ("sampled at temperature 1 and top_p 1, the only setting this checks: prompt logprobs are the target's "
             "raw distribution")
    assert C.sampling_notes(acceptance(accepted_tokens=0), []) == [
        first, "the spec-on server accepted no draft token during sampling: speculation was not exercised, so the "
               "test says nothing about it"]
    assert C.sampling_notes(AcceptanceSummary(known=False, reason="r"), []) == [
        first, "acceptance of the spec-on server is unknown (r): the run cannot show that speculation was exercised"]
    two = [C.Sample("p", 0, 0, (1,), (2,), "stop"), C.Sample("p", 1, 1, (1,), (2,), "abort")]
    assert C.sampling_notes(None, two) == [
        first, "2 sample(s) ended before max_tokens (stop): a stop the server applied although ignore_eos was set"]


def test_the_report_uses_the_settings_and_both_servers():
    samples, draws = simulated(8, 1.0)
    inputs = C.inputs_for([Prompt(id="p", prompt="x")], [[0]], 16)
    on = ServerInfo(backend="vllm", base_url="http://on", version="0.32.0", model_id="m", spec_enabled=False)
    off = ServerInfo(backend="vllm", base_url="http://off", version="0.31.0", model_id="n", spec_enabled=False)
    unknown = AcceptanceSummary(known=False, reason="no counters")
    report = C.sampling_report(settings(alpha=0.05, bins=10, seed=5), on, off, inputs, samples, draws, unknown)
    assert (report.stats.alpha, report.stats.bins, report.stats.seed) == (0.05, 10, 5)
    assert report.source_server == off and report.on_server == on
    assert "the servers serve different model ids (n vs m)" in report.notes
    assert any(n.startswith("the sides differ in more than speculation: ") for n in report.notes)
    assert not any("acceptance of the spec-on server is unknown" in n for n in report.notes)  # said once already
    on_spec = on.model_copy(update={"spec_enabled": True})
    report = C.sampling_report(settings(), on_spec, off, inputs, samples, draws, acceptance(accepted_tokens=0))
    assert any("accepted no draft token" in n for n in report.notes)
    report = C.sampling_report(settings(), on_spec, off, inputs, samples, draws, unknown)
    assert any("acceptance of the spec-on server is unknown" in n for n in report.notes)
    same = C.sampling_report(settings(), on_spec, on_spec, inputs, samples, draws, None)  # a server against itself
    assert not any(n.startswith("the sides differ") for n in same.notes)
    # one URL is one server, even where its two descriptions differ (read at two moments): no sides to compare
    reread = on_spec.model_copy(update={"version": "0.31.0", "dtype": "float32"})
    same = C.sampling_report(settings(), on_spec, reread, inputs, samples, draws, None)
    assert not any(n.startswith("the sides differ") for n in same.notes)


def test_a_server_source_without_its_description_is_unnamed():
    assert C.source_text(settings(), None) == "the spec-off server's prompt_logprobs at ?, top 10"


def test_more_error_message_forms_and_vllms_max_allowed_alone():
    assert W.error_message(httpx.Response(400, json={"error": 5, "detail": "d"}).content) == "d"
    assert R.refuses_k("prompt logprobs: 25 is above the max allowed (20)")


def test_timeouts_and_empty_connection_errors_are_one_line():
    def slow(request):
        raise httpx.ReadTimeout("", request=request)

    with pytest.raises(ServerUnreachable) as err:
        score(slow)
    assert str(err.value) == ("the source server did not answer /v1/completions in time (ReadTimeout): raise "
                              "--request-timeout or lower --concurrency")

    def silent(request):
        raise httpx.ConnectError("", request=request)

    with pytest.raises(ServerUnreachable) as err:
        score(silent)
    assert str(err.value) == "the source server at http://fake:8000 cannot be reached (ConnectError: no detail)"


def draw(handler, samples=1):
    inputs = C.inputs_for([CHAT], [[1, 2]], max_tokens=3)
    return asyncio.run(S.draw_samples(FakeServer(), inputs, samples, 0, 1, 10, transport=httpx.MockTransport(handler)))


def test_spec_on_sampling_errors_name_the_spec_on_server():
    with pytest.raises(ServerError) as err:
        draw(lambda r: httpx.Response(400, json={"error": {"message": "bad"}}))
    assert str(err.value) == "the spec-on server refused a sampling request for prompt 'chat' (HTTP 400: bad)"

    def dead(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServerUnreachable) as err:
        draw(dead)
    assert str(err.value) == "the spec-on server at http://fake:8000 cannot be reached (ConnectError: refused)"


def test_samples_keep_their_index_finish_reason_and_model():
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        answer = sample_answer(3)
        answer["choices"][0]["finish_reason"] = "stop"
        return httpx.Response(200, json=answer)

    samples = draw(handler, samples=2)
    assert [(s.index, s.finish_reason) for s in samples] == [(0, "stop"), (1, "stop")]
    assert {b["model"] for b in bodies} == {"m"}


def test_tokenize_errors_exactly():
    def refuse(request):
        return httpx.Response(400, json={"error": {"message": "no template"}})

    with pytest.raises(ServerError) as err:
        asyncio.run(S.tokenize_on_server(FakeServer(), [CHAT], 10, transport=httpx.MockTransport(refuse)))
    assert str(err.value) == ("the server refused POST /tokenize for prompt 'chat' (HTTP 400: no template); it needs "
                              "vLLM's /tokenize, or give --reference DIR to tokenize locally")

    def dead(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ServerUnreachable) as err:
        asyncio.run(S.tokenize_on_server(FakeServer(), [CHAT], 10, transport=httpx.MockTransport(dead)))
    assert str(err.value) == "the source server at http://fake:8000 cannot be reached (ConnectError: refused)"
    with pytest.raises(NotAServer) as err:
        W.parse_tokenize({})
    assert str(err.value) == "the server's /tokenize answer has no list of token ids ('tokens')"


def test_inputs_need_one_id_list_per_prompt():
    with pytest.raises(ValueError):
        C.inputs_for([CHAT, TEXT], [[1]], 8)


def test_the_report_states_power_at_the_settings_power():
    samples, draws = simulated(8, 1.0)
    inputs = C.inputs_for([Prompt(id="p", prompt="x")], [[0]], 16)
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    report = C.sampling_report(settings(power=0.9), on, None, inputs, samples, draws)
    assert report.stats.power == 0.9


def test_scoring_at_the_raw_setting_is_the_sources_top_k_and_at_any_other_its_exact_distribution():
    data, sample = scored()

    def handler(request):
        return httpx.Response(200, json=data)

    async def _score(setting):
        server = FakeServer()
        server.transport = httpx.MockTransport(handler)
        return await S.score_samples(server, [sample], setting, 2, 1, 10)

    raw = asyncio.run(_score(S.RAW))
    assert raw == [R.parse_scores(data, sample, k=2)]  # `equiv --sampling`: the top K as the source gave it
    (first, second), = asyncio.run(_score(F.Setting(top_k=2)))
    # top_k 2 within the source's top 2: the exact distribution, renormalised over the support
    assert first.full_vocab and set(first.top) == {7, 8}
    assert math.isclose(sum(math.exp(v) for v in first.top.values()), 1.0)
    assert second.token == 9 and second.logprob == -math.inf  # outside the setting's support


# orchestration/sampling.py edges: the requests that succeed (path, body, timeout), the client's own
# connections and TLS setting against a loopback server, the report's settings, and the float64
# reference (`--reference DIR`): its tokenizer, its missing-package messages, the prompt state it
# keeps per prompt and the float64 log-softmax.
#
# vLLM's answer shapes are 0.32's (see tests/unit/test_sampling_probe.py): /tokenize answers
# ``{"count", "max_model_len", "tokens", "token_strs"}``; prompt_logprobs are a list with None for
# the first prompt token, then ``{"<id>": {"logprob", "rank", "decoded_token"}}`` per position.
# what every request of a client made with request timeout 7 s carries (httpx's per-request timeout)
TIMEOUT_7 = {"connect": 10.0, "read": 7, "write": 30.0, "pool": None}






# --- requests that succeed --------------------------------------------------------------------------------
def test_tokenize_on_server_posts_each_prompt_to_tokenize_and_returns_its_ids():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.method, request.url.path, body, request.extensions["timeout"]))
        tokens = [1, 4093, 198] if "messages" in body else [33, 28]
        return httpx.Response(200, json={"count": len(tokens), "max_model_len": 8192, "tokens": tokens,
                                         "token_strs": None})

    ids = asyncio.run(S.tokenize_on_server(FakeServer(), [CHAT, TEXT], 7, transport=httpx.MockTransport(handler)))
    assert ids == [[1, 4093, 198], [33, 28]]
    assert seen == [
        ("POST", "/tokenize", {"model": "m", "messages": [{"role": "user", "content": "Copy: a b c"}],
                               "add_generation_prompt": True}, TIMEOUT_7),
        ("POST", "/tokenize", {"model": "m", "prompt": "1, 2, 3,"}, TIMEOUT_7)]


def test_samples_are_posted_to_v1_completions_with_the_request_timeout():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.extensions["timeout"]))
        return httpx.Response(200, json={"choices": [{"text": "", "finish_reason": "length",
                                                      "logprobs": {"tokens": ["token_id:5", "token_id:6"]}}]})

    inputs = C.inputs_for([TEXT], [[33, 28]], max_tokens=2)
    samples = asyncio.run(S.draw_samples(FakeServer(), inputs, 2, 40, 1, 7, transport=httpx.MockTransport(handler)))
    assert seen == [("POST", "/v1/completions", TIMEOUT_7)] * 2
    assert samples == [C.Sample("text", 0, 40, (33, 28), (5, 6), "length"),
                       C.Sample("text", 1, 41, (33, 28), (5, 6), "length")]


def test_scoring_on_the_server_gives_one_draw_per_sampled_token():
    sample = C.Sample(prompt_id="p", index=3, seed=3, prompt_ids=(1,), tokens=(2, 3))
    seen, ticks = [], []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.method, request.url.path, body["prompt"], body["prompt_logprobs"],
                     request.extensions["timeout"]))
        plps = [None, {"2": entry(-0.5, 1), "4": entry(-1.2, 2)},
                {"3": entry(-2.5, 3), "5": entry(-0.1, 1), "6": entry(-2.4, 2)}]  # 3 outside the top 2
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": plps,
                                                      "prompt_token_ids": [1, 2, 3]}]})

    draws = asyncio.run(S.score_on_server(FakeServer(), [sample], 2, 1, 7,
                                          progress=lambda rec: ticks.append((rec.prompt_id, rec.ok)),
                                          transport=httpx.MockTransport(handler)))
    assert seen == [("POST", "/v1/completions", [1, 2, 3], 2, TIMEOUT_7)]
    assert draws == [[TokenDraw(top={2: -0.5, 4: -1.2}, token=2, logprob=-0.5, position=0, prompt_id="p"),
                      TokenDraw(top={5: -0.1, 6: -2.4}, token=3, logprob=-2.5, position=1, prompt_id="p")]]
    assert ticks == [("p", True)]


def test_the_client_times_out_reads_at_the_request_timeout_and_connects_at_ten_seconds():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"tokens": [1]})

    asyncio.run(S.tokenize_on_server(FakeServer(), [TEXT], 7, transport=httpx.MockTransport(handler)))
    request, = seen
    assert request.extensions["timeout"] == {"connect": 10.0, "read": 7, "write": 30.0, "pool": None}
    assert request.headers["Authorization"] == "Bearer k" and str(request.url) == "http://fake:8000/tokenize"


# --- the client's own connections, against a loopback server ----------------------------------------------
class Loopback:
    """An HTTP/1.1 server on 127.0.0.1 in the test's own event loop: answers every request with ``{}``
    on a kept-alive connection and counts the connections it accepted."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        self.tls = tls
        self.connections = 0

    async def __aenter__(self) -> Loopback:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def server_at(url: str, verify=True) -> FakeServer:
    server = FakeServer()
    server.base_url, server.verify = url, verify
    return server


async def post_at_once(server: FakeServer, concurrency: int, n: int) -> list[int]:
    """``n`` POSTs started together on one client of ``concurrency`` connections: their statuses."""
    async with Wire.for_server(server, timeout_s=10, concurrency=concurrency) as client:
        answers = await asyncio.gather(*(S._post(client, "/v1/completions", {}, "source server") for _ in range(n)))
    return [status for status, _, _ in answers]


def test_a_client_opens_at_most_concurrency_connections():
    async def run():
        async with Loopback() as lo:
            statuses = await post_at_once(server_at(f"http://127.0.0.1:{lo.port}"), 2, 6)
            return statuses, lo.connections

    statuses, connections = asyncio.run(run())
    assert statuses == [200] * 6 and connections == 2  # six requests at once, over two kept-alive connections


def self_signed(tmp_path) -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "specadapt test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return ctx


def test_a_client_honours_the_servers_tls_setting(tmp_path):
    pytest.importorskip("cryptography")

    async def run():
        async with Loopback(tls=self_signed(tmp_path)) as lo:
            return await post_at_once(server_at(f"https://127.0.0.1:{lo.port}", verify=False), 1, 1)

    assert asyncio.run(run()) == [200]  # --insecure: a self-signed certificate is accepted


# --- the report ---------------------------------------------------------------------------------------------
def settings_sampling_probe(**kw) -> SamplingSettings:
    return SamplingSettings(**{"samples": 1, "max_tokens": 2, "alpha": 0.01, "top_logprobs": 2, "concurrency": 1,
                               "seed": 0, "request_timeout_s": 60, "source": "server",
                               "tokenizer": "the spec-off server's /tokenize", **kw})


def test_the_report_keeps_the_acceptance_and_states_the_tokens_needed_for_the_settings_targets():
    inputs = C.inputs_for([TEXT], [[4]], 2)
    samples = [C.Sample("text", 0, 0, (4,), (7, 8))]
    draws = [[TokenDraw(top={7: -0.1}, token=7), TokenDraw(top={8: -0.1}, token=8)]]
    on = ServerInfo(backend="vllm", base_url="http://on", model_id="m", spec_enabled=True)
    seen = AcceptanceSummary(known=True, drafts=4, draft_tokens=8, accepted_tokens=3)
    report = C.sampling_report(settings_sampling_probe(tv_targets=[0.5, 1.0]), on, None, inputs, samples, draws, seen)
    assert report.acceptance == seen
    # lambda* of 19 dof at alpha 0.01 / 3 and power 0.8 is about 30, so TV 0.5 needs ~30 / (4 * 0.25) tokens:
    # the too-few floor of 5 * 20 tokens is what is needed
    assert [(t.tv, t.samples_needed) for t in report.stats.samples_needed] == [(0.5, 100), (1.0, 100)]
    assert C.sampling_report(settings_sampling_probe(), on, None, inputs, samples, draws).acceptance is None


# --- the float64 reference ------------------------------------------------------------------------------------
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_a_reference_without_torch_says_which_extra_to_install(tmp_path, monkeypatch):
    ref = T.ReferenceTarget(model_dir(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependency) as err:
        ref.tokenize(TEXT)
    assert str(err.value) == ("--reference (float64 recomputation) needs the Python package 'torch', which is not "
                              "installed: pip install 'specadapt[reference]'")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependency) as err:
        ref.tokenize(TEXT)
    assert str(err.value) == ("--reference (float64 recomputation) needs the Python package 'transformers', which is "
                              "not installed: pip install 'specadapt[reference]'")


SMOL = embedded_model_dir()


@pytest.fixture(scope="module")
def smol_tokenizer():
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    if not (SMOL / "tokenizer.json").is_file():
        pytest.skip(f"the embedded model is not at {SMOL}")
    return tokenizers.Tokenizer.from_file(str(SMOL / "tokenizer.json"))


def test_the_reference_tokenizes_chat_with_the_template_and_the_generation_prompt(smol_tokenizer):
    # SmolLM2's chat_template.jinja rendered by hand: its default system turn, the user turn, then the
    # assistant's opening (add_generation_prompt); its tokenizer adds no special tokens to plain text
    rendered = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\nCopy: a b c<|im_end|>\n<|im_start|>assistant\n")
    ref = T.ReferenceTarget(SMOL)
    assert ref.tokenize(CHAT) == smol_tokenizer.encode(rendered).ids
    assert ref.tokenize(TEXT) == smol_tokenizer.encode("1, 2, 3,").ids
    assert ref.tokenize(CHAT)[-4:] == smol_tokenizer.encode("<|im_start|>assistant\n").ids


def test_a_reference_without_a_chat_template_takes_completion_prompts_only(smol_tokenizer, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # no chat_template.jinja
        shutil.copy(SMOL / name, tmp_path / name)
    ref = T.ReferenceTarget(tmp_path)
    with pytest.raises(UsageError) as err:
        ref.tokenize(CHAT)
    assert str(err.value) == (f"--reference {tmp_path} has no chat template: give completion prompts ('prompt') or "
                              "a model with one")
    assert ref.tokenize(TEXT) == smol_tokenizer.encode("1, 2, 3,").ids


class ListTokenizer:
    """transformers 4's answer to apply_chat_template(tokenize=True): a plain list of ids."""

    chat_template = "{{ messages }}"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        self.calls.append((messages, add_generation_prompt, tokenize))
        return [5, 6, 7] if tokenize else "text"


def test_a_chat_template_answer_as_a_plain_list_is_read_too(tmp_path):
    ref = T.ReferenceTarget(model_dir(tmp_path))
    ref._tokenizer = tok = ListTokenizer()  # a loaded tokenizer is used as it is
    assert ref.tokenize(CHAT) == [5, 6, 7]
    assert tok.calls == [([{"role": "user", "content": "Copy: a b c"}], True, True)]


class Bigram:
    """A causal LM whose float32 logits at a position depend only on the token there (a model whose head
    stays in float32); counts its forward passes by the length of their input."""

    def __init__(self, torch, vocab: int = 12):
        self.torch = torch
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)).float() * 3
        self.passes = []

    def eval(self):
        return self

    def __call__(self, input_ids, use_cache=None, past_key_values=None):
        self.passes.append(input_ids.shape[1])
        return types.SimpleNamespace(logits=self.table[input_ids[0]].unsqueeze(0), past_key_values=["cache"])


def test_the_reference_scores_in_float64_and_runs_each_prompt_once(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, loads = Bigram(torch), []

    def from_pretrained(path, dtype=None):
        loads.append((path, dtype))
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    ref = T.ReferenceTarget(model_dir(tmp_path))
    samples = [C.Sample("p", 0, 0, (3, 4, 5), (6, 7, 8)), C.Sample("p", 1, 1, (3, 4, 5), (9, 6)),
               C.Sample("q", 2, 2, (10, 11), (1,))]
    scored = S.score_on_reference(ref, samples, k=3)
    assert loads == [(str(tmp_path), torch.float64)]
    # prompt p once, its first sample's 2 tokens before the last, the second's 1; prompt q once
    assert model.passes == [3, 2, 1, 2]
    for sample, draws in zip(samples, scored, strict=True):
        before = [sample.prompt_ids[-1], *sample.tokens[:-1]]  # the token whose logits give position j
        assert len(draws) == len(sample.tokens)
        for j, d in enumerate(draws):
            row = torch.log_softmax(model.table[before[j]].double(), -1)  # float64 of the float32 logits
            values, ids = torch.topk(row, 3)
            assert d == TokenDraw(top={int(t): float(v) for t, v in zip(ids, values, strict=True)},
                                  token=sample.tokens[j], logprob=float(row[sample.tokens[j]]), position=j, prompt_id=sample.prompt_id)


def test_the_reference_keeps_the_prompts_cache_even_when_the_config_turns_caching_off(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    sample = C.Sample("p", 0, 0, (3, 4, 5), (6, 7, 8))
    draws = T.ReferenceTarget(tmp_path).score(sample, k=4)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[3, 4, 5, 6, 7, 8]])).logits[0], -1)
    assert [d.logprob for d in draws] == pytest.approx([float(logp[2 + j, t]) for j, t in enumerate((6, 7, 8))],
                                                       abs=1e-9)
