"""The target's probabilities over a prompt (vLLM's ``prompt_logprobs``) and ``/tokenize``.

Engine level: ``prompt_logprobs_of`` against log_softmax computed here on a tiny float64
model (whole vocabulary, ranks, top-K order, chunks), and a prefill that also returns
prompt logprobs emits the same tokens as one that does not. Server level (uvicorn on
loopback): the answer has vLLM's shape (first entry None, string token-id keys, the prompt
token first with its true rank, then the top K best first) and equals a direct
transformers computation on the same ids, on servers without speculation, with a draft
model and with n-gram lookup; the K limit (``max_logprobs``) and vLLM's request checks;
``/tokenize`` equals the tokenizer (plain prompts and chat messages) and ``/detokenize``
its decode.
"""

from __future__ import annotations

import json
import random
import shutil

import httpx
import pytest
import torch

from specadapt.native_reference.engine import SpecEngine, prompt_logprobs_of
from specadapt.native_reference.runtime import open_reference
from specadapt.native_reference.sampling import SamplingParams

from .test_server import serving

K = 5


# -- engine ------------------------------------------------------------------------------

@torch.inference_mode()
def exact_logp(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits over ``ids`` in float64: row i predicts ids[i+1]."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].to(torch.float64)
    return torch.log_softmax(logits, dim=-1)


@torch.inference_mode()
def test_prompt_logprobs_of_whole_vocabulary(tiny_target):
    """k = -1 on V = 64: every token of every position, values equal to log_softmax, the
    prompt token's rank its place in the sorted order, the rest ranked 1..V best first;
    k = 0 gives the prompt token alone and k = 3 the prompt token then the best three."""
    ids = [3, 17, 5, 9, 3, 17, 22, 41]
    logits = tiny_target(input_ids=torch.tensor([ids])).logits[0, :-1]  # float64
    logp = torch.log_softmax(logits, dim=-1)
    V = logp.shape[-1]
    whole = prompt_logprobs_of(logits, ids[1:], -1)
    none = prompt_logprobs_of(logits, ids[1:], 0)
    three = prompt_logprobs_of(logits, ids[1:], 3)
    assert len(whole) == len(none) == len(three) == len(ids) - 1
    for i, tok in enumerate(ids[1:]):
        order = torch.argsort(logp[i], descending=True).tolist()
        own = (tok, float(logp[i, tok]), order.index(tok) + 1)
        assert whole[i][0] == own and none[i] == [own]
        assert len(whole[i]) == V + 1
        assert [t for t, _, _ in whole[i][1:]] == order
        assert [r for _, _, r in whole[i][1:]] == list(range(1, V + 1))
        assert [v for _, v, _ in whole[i][1:]] == logp[i, order].tolist()
        assert three[i] == [own] + whole[i][1:4]


def test_prompt_logprobs_of_rank_counts_ties_against_the_token():
    """vLLM's rank is the number of tokens with a logprob >= the token's own: 1 for a
    unique best, 2 for either of two tied best, and so on."""
    logits = torch.tensor([[2.0, 2.0, 1.0, -1.0], [0.0, 3.0, 3.0, 3.0]])
    out = prompt_logprobs_of(logits, [1, 0], 1)
    assert [e[0][2] for e in out] == [2, 4]
    assert out[0][1][0] in (0, 1) and out[0][1][2] == 1
    unique = prompt_logprobs_of(torch.tensor([[5.0, 1.0, 0.0]]), [0], 2)
    assert unique[0][0][2] == 1 and [t for t, _, _ in unique[0][1:]] == [0, 1]


def test_prompt_logprobs_of_chunks_and_dtype(tiny_target):
    """Chunks of positions give the same answer as one; float32 logits stay float32 (a
    float64 log_softmax of them would differ in the last bits), bfloat16 ones are widened
    to float32 first."""
    ids = [3, 17, 5, 9, 3, 17, 22, 41, 8]
    logits = tiny_target(input_ids=torch.tensor([ids])).logits[0, :-1]
    assert prompt_logprobs_of(logits, ids[1:], 4, chunk=3) == prompt_logprobs_of(logits, ids[1:], 4)
    f32 = logits.float()
    got = [e[0][1] for e in prompt_logprobs_of(f32, ids[1:], 0)]
    want = torch.log_softmax(f32, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    assert got == want
    bf = logits.to(torch.bfloat16)
    got = [e[0][1] for e in prompt_logprobs_of(bf, ids[1:], 0)]
    want = torch.log_softmax(bf.float(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    assert got == want


@pytest.mark.parametrize("k", [-2, 65])
def test_prompt_logprobs_of_refuses_k_outside_the_vocabulary(k):
    with pytest.raises(ValueError, match="-1 or in 0..64"):
        prompt_logprobs_of(torch.zeros(2, 64), [1, 2], k)


def test_prompt_logprobs_of_refuses_mismatched_tokens():
    with pytest.raises(ValueError, match="2 rows of logits for 3 tokens"):
        prompt_logprobs_of(torch.zeros(2, 64), [1, 2, 3], 0)


def test_prefill_with_prompt_logprobs_generates_the_same(tiny_target, tiny_draft):
    """Asking for prompt logprobs changes the prefill (the head over every position), not
    what is generated: same seed, same tokens, greedy and sampling; the first Step carries
    None then one entry per prompt token, later Steps nothing."""
    from specadapt.native_reference.proposers import DraftModelProposer

    ids = [3, 17, 5, 9, 3, 17, 22, 41]
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        runs = []
        for k in (None, 2):
            engine = SpecEngine(tiny_target, DraftModelProposer(tiny_draft), 3)
            row, first = engine.add(ids, 12, params, seed=9, prompt_logprobs=k)
            steps = [first]
            while engine.rows:
                steps += [s for _, s in engine.step()]
            runs.append((row.tokens, steps))
        (plain, plain_steps), (asked, asked_steps) = runs
        assert asked == plain
        assert plain_steps[0].prompt_logprobs is None
        got = asked_steps[0].prompt_logprobs
        assert got[0] is None and len(got) == len(ids)
        logits = tiny_target(input_ids=torch.tensor([ids])).logits[0, :-1]
        want = prompt_logprobs_of(logits, ids[1:], 2)
        for g, w in zip(got[1:], want):
            assert [t for t, _, _ in g] == [t for t, _, _ in w]
            assert [r for _, _, r in g] == [r for _, _, r in w]
            assert [v for _, v, _ in g] == pytest.approx([v for _, v, _ in w], abs=1e-12)
        assert all(s.prompt_logprobs is None for s in asked_steps[1:])


def test_one_token_prompt_has_only_the_first_entry(tiny_target):
    _, step = SpecEngine(tiny_target).add([7], 1, prompt_logprobs=3)
    assert step.prompt_logprobs == [None]


# -- server ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target_model(tiny_dirs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dirs[0]), dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def plain_ref(tiny_dirs):
    return open_reference(tiny_dirs[0], dtype="float32")


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def completion(base: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", json=body, timeout=120)


def check_against(entries: list, ids: list[int], logp: torch.Tensor, k: int, tol: float = 1e-4) -> None:
    """``entries`` (a response's prompt_logprobs) against the float64 ``logp``: vLLM's
    shape, values within float32 tolerance, the true rank, the true top k best first."""
    assert entries[0] is None and len(entries) == len(ids)
    for i, entry in enumerate(entries[1:]):
        row, tok = logp[i], ids[i + 1]
        assert all(isinstance(key, str) for key in entry)
        items = [(int(key), v) for key, v in entry.items()]
        assert items[0][0] == tok  # the prompt token comes first
        own = items[0][1]
        assert own["logprob"] == pytest.approx(float(row[tok]), abs=tol)
        # its rank among 49152 close values: exact up to ties within the tolerance
        assert int((row > row[tok] + tol).sum()) + 1 <= own["rank"] <= int((row >= row[tok] - tol).sum())
        top = items if own["rank"] <= k else items[1:]
        top = sorted(top, key=lambda kv: kv[1]["rank"])[:k]
        assert len(entry) == k + (own["rank"] > k)
        assert [v["rank"] for _, v in top] == list(range(1, k + 1))
        values = [v["logprob"] for _, v in top]
        assert values == sorted(values, reverse=True)
        best = torch.topk(row, k + 1).values
        for tid, v in top:
            assert v["logprob"] == pytest.approx(float(row[tid]), abs=tol)
            assert float(row[tid]) >= float(best[k - 1]) - tol  # among the true top k
        assert all(set(v) == {"logprob", "rank", "decoded_token"} for _, v in items)


@pytest.mark.parametrize("spec", ["none", "draft", "ngram"])
def test_prompt_logprobs_equal_transformers(tiny_dirs, target_model, spec):
    """The same answer, equal to a direct float64 computation on the same ids (within
    float32 tolerance), whether the server speculates or not; with max_tokens 1, greedy
    and sampling; decoded_token is the token decoded alone."""
    target, draft, _ = tiny_dirs
    ref = open_reference(target, draft if spec == "draft" else None, ngram=spec == "ngram", k=3,
                         dtype="float32")
    ids = prompt_ids(24, target_model.config.vocab_size, seed=1)
    logp = exact_logp(target_model, ids)
    with serving(ref) as base:
        for body in ({"temperature": 1.0, "top_p": 1.0, "seed": 5, "ignore_eos": True},
                     {"temperature": 0}, {"temperature": 0.3, "top_k": 4}):
            r = completion(base, {"model": ref.model_name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": K,
                                  "logprobs": 0, "return_tokens_as_token_ids": True, **body})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            check_against(choice["prompt_logprobs"], ids, logp, K)
            assert len(choice["logprobs"]["tokens"]) == 1
    tok = ref.tokenizer
    first = choice["prompt_logprobs"][1]
    assert {v["decoded_token"] for v in first.values()} == {tok.decode([int(t)]) for t in first}


def test_prompt_logprobs_in_chat_at_the_top(plain_ref, target_model):
    """vLLM puts a chat answer's prompt_logprobs at the top of the response, over the
    templated prompt; K = 0 gives the prompt token alone."""
    messages = [{"role": "user", "content": "two plus two"}]
    ids = plain_ref.encode_messages(messages)
    with serving(plain_ref) as base:
        r = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "messages": messages, "max_tokens": 1, "prompt_logprobs": 0})
        plain = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "prompt_logprobs" not in body["choices"][0]
    assert body["usage"]["prompt_tokens"] == len(ids)
    check_against(body["prompt_logprobs"], ids, exact_logp(target_model, ids), 0)
    assert plain.json()["prompt_logprobs"] is None


def test_completion_without_prompt_logprobs_says_null(plain_ref):
    with serving(plain_ref) as base:
        r = completion(base, {"prompt": [5, 6, 7], "max_tokens": 1})
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["prompt_logprobs"] is None
    assert choice["prompt_token_ids"] is None and choice["token_ids"] is None


def test_return_token_ids_echoes_the_prompt_and_the_output(plain_ref):
    """vLLM's return_token_ids: the prompt's ids and the generated ids (a completion: both
    in the choice; a chat answer: the prompt's at the top), so a client can check that the
    server scored exactly the ids it sent."""
    messages = [{"role": "user", "content": "hi"}]
    with serving(plain_ref) as base:
        r = completion(base, {"prompt": [5, 6, 7], "max_tokens": 3, "return_token_ids": True, "logprobs": 0,
                              "return_tokens_as_token_ids": True, "ignore_eos": True})
        chat = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
            "messages": messages, "max_tokens": 2, "return_token_ids": True, "ignore_eos": True})
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == [5, 6, 7]
    assert choice["token_ids"] == [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
    assert len(choice["token_ids"]) == 3
    body = chat.json()
    assert body["prompt_token_ids"] == plain_ref.encode_messages(messages)
    assert "prompt_token_ids" not in body["choices"][0] and len(body["choices"][0]["token_ids"]) == 2


def test_k_limit_and_checks_as_vllm(plain_ref):
    """--max-logprobs (20 by default) caps K, vLLM's message and 400; K = -1 is the whole
    vocabulary (49152 here), so it is refused under the default cap; the other checks of
    vLLM's request validators."""
    ids = [5, 6, 7, 8]

    def ask(base, **extra):
        return completion(base, {"prompt": ids, "max_tokens": 1, **extra})

    with serving(plain_ref) as base:
        ok = ask(base, prompt_logprobs=20)
        assert ok.status_code == 200
        assert all(len(e) >= 20 for e in ok.json()["choices"][0]["prompt_logprobs"][1:])
        cases = [
            ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than max allowed: 20 "
                                      "(parameter=prompt_logprobs, value=21)", "prompt_logprobs"),
            ({"prompt_logprobs": -1}, "Requested prompt logprobs of 49152, which is greater than max allowed: 20 "
                                      "(parameter=prompt_logprobs, value=49152)", "prompt_logprobs"),
            ({"prompt_logprobs": -2}, "`prompt_logprobs` must be a positive value or -1. "
                                      "(parameter=prompt_logprobs, value=-2)", "prompt_logprobs"),
            ({"prompt_logprobs": "3"}, "`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value=3)",
             "prompt_logprobs"),
            ({"prompt_logprobs": True}, "`prompt_logprobs` must be an integer.", "prompt_logprobs"),
            ({"prompt_logprobs": 1, "stream": True},
             "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)", "prompt_logprobs"),
            ({"prompt_logprobs": -1, "stream": True}, "not available when `stream=True`", "prompt_logprobs"),
            ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20", "logprobs"),
            ({"logprobs": -1}, "Requested sample logprobs of 49152", "logprobs"),
            ({"logprobs": -3}, "`logprobs` must be a positive value or -1.", "logprobs"),
        ]
        for extra, message, param in cases:
            r = ask(base, **extra)
            assert r.status_code == 400, (extra, r.text)
            error = r.json()["error"]
            assert message in error["message"] and error["param"] == param, (extra, error)
            assert error["type"] == "BadRequestError" and error["code"] == 400
        chat = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True, "top_logprobs": 21})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"
        # prompt_logprobs 0 with a stream is allowed (vLLM's rule) and streams nothing extra
        with httpx.stream("POST", f"{base}/v1/completions", timeout=60, json={
                "prompt": ids, "max_tokens": 2, "prompt_logprobs": 0, "stream": True}) as r:
            lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        assert r.status_code == 200 and lines and all("prompt_logprobs" not in c["choices"][0]
                                                      for c in lines if c["choices"])


def test_max_logprobs_option(plain_ref):
    """A smaller cap refuses one past it; -1 lifts the cap: K = -1 then returns the whole
    vocabulary at every position, ranks 1..V."""
    with serving(plain_ref, max_logprobs=5) as base:
        assert completion(base, {"prompt": [5, 6], "max_tokens": 1, "prompt_logprobs": 5}).status_code == 200
        r = completion(base, {"prompt": [5, 6], "max_tokens": 1, "prompt_logprobs": 6})
        assert r.status_code == 400 and "greater than max allowed: 5" in r.json()["error"]["message"]
    with serving(plain_ref, max_logprobs=-1) as base:
        r = completion(base, {"prompt": [5, 6], "max_tokens": 1, "prompt_logprobs": -1})
    assert r.status_code == 200
    entries = r.json()["choices"][0]["prompt_logprobs"]
    V = len(plain_ref.tokenizer)
    assert len(entries) == 2 and len(entries[1]) == V
    assert sorted(v["rank"] for v in entries[1].values()) == list(range(1, V + 1))


def test_minus_infinity_is_sent_as_vllm_clamps_it(plain_ref):
    """A token the model rules out (logprob -inf) is sent as -9999.0 (vLLM's clamp: JSON has
    no -inf); a prompt token among the top K keeps its first place and takes the top-K
    entry (vLLM's dict)."""
    from specadapt.native_reference.server import ServerState, _prompt_logprobs

    state = ServerState(plain_ref, "m", None, None, vocab=len(plain_ref.tokenizer))
    inf = float("-inf")
    out = _prompt_logprobs(state, [None, [(7, inf, 3), (5, -0.1, 1), (6, -2.5, 2), (7, inf, 3)],
                                   [(5, -0.2, 2), (9, -0.1, 1), (5, -0.2, 2)]])
    assert out[0] is None
    assert list(out[1]) == ["7", "5", "6"]
    assert out[1]["7"]["logprob"] == -9999.0 and out[1]["5"]["logprob"] == -0.1
    assert list(out[2]) == ["5", "9"] and out[2]["5"]["rank"] == 2
    assert out[1]["5"]["decoded_token"] == plain_ref.tokenizer.decode([5])
    assert _prompt_logprobs(state, None) is None


# -- /tokenize, /detokenize -----------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4"}]


def test_tokenize_equals_the_tokenizer(plain_ref):
    tok = plain_ref.tokenizer
    text = "def add(a, b):\n    return a + b"
    with serving(plain_ref) as base:
        def post(body):
            r = httpx.post(f"{base}/tokenize", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()

        plain = post({"model": plain_ref.model_name, "prompt": text})
        strs = post({"prompt": text, "return_token_strs": True})
        chat = post({"messages": MESSAGES})
        no_gen = post({"messages": MESSAGES, "add_generation_prompt": False})
        cont = post({"messages": MESSAGES, "add_generation_prompt": False, "continue_final_message": True})
    ids = tok(text)["input_ids"]
    assert plain == {"count": len(ids), "max_model_len": plain_ref.engine.max_model_len, "tokens": ids,
                     "token_strs": None}
    assert strs["tokens"] == ids and strs["token_strs"] == tok.convert_ids_to_tokens(ids)

    def templated(**kw):
        out = tok.apply_chat_template(MESSAGES, tokenize=True, **kw)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    assert chat["tokens"] == templated(add_generation_prompt=True) and chat["count"] == len(chat["tokens"])
    assert no_gen["tokens"] == templated(add_generation_prompt=False)
    assert cont["tokens"] == templated(continue_final_message=True)
    assert len({tuple(chat["tokens"]), tuple(no_gen["tokens"]), tuple(cont["tokens"])}) == 3


def test_tokenize_add_special_tokens(tiny_dirs, tmp_path):
    """A tokenizer that adds a BOS: /tokenize adds it to a plain prompt by default and not
    to templated messages (vLLM's defaults), and each flag turns that around."""
    target = tiny_dirs[0]
    bos_dir = tmp_path / "bos"
    shutil.copytree(target, bos_dir)
    spec = json.loads((bos_dir / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
    (bos_dir / "tokenizer.json").write_text(json.dumps(spec))
    ref = open_reference(bos_dir, dtype="float32")
    bare = ref.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    with serving(ref) as base:
        def tokens(body):
            return httpx.post(f"{base}/tokenize", json=body, timeout=60).json()["tokens"]

        assert tokens({"prompt": "hello there"}) == [0] + bare
        assert tokens({"prompt": "hello there", "add_special_tokens": False}) == bare
        chat = tokens({"messages": MESSAGES})
        assert tokens({"messages": MESSAGES, "add_special_tokens": True}) == [0] + chat
    assert chat[0] != 0


def test_tokenize_and_detokenize_refusals(plain_ref):
    with serving(plain_ref) as base:
        def refused(path, body, status=400):
            r = httpx.post(f"{base}{path}", json=body, timeout=60)
            assert r.status_code == status, (body, r.text)
            return r.json()["error"]["message"]

        assert "give 'prompt'" in refused("/tokenize", {})
        assert "'prompt' must be a string" in refused("/tokenize", {"prompt": [1, 2]})
        assert "'messages' must be a list" in refused("/tokenize", {"messages": "hi"})
        assert "'messages' must be a list" in refused("/tokenize", {"messages": ["hi"]})
        assert "'add_generation_prompt' must be true or false" in refused(
            "/tokenize", {"messages": MESSAGES, "add_generation_prompt": "yes"})
        assert "continue_final_message and add_generation_prompt are not compatible" in refused(
            "/tokenize", {"messages": MESSAGES, "continue_final_message": True})  # transformers' words, as vLLM's
        assert "not served here" in refused("/tokenize", {"model": "other", "prompt": "x"}, 404)
        assert "must be a JSON object" in refused("/tokenize", [1])
        r = httpx.post(f"{base}/tokenize", content=b"{nope", timeout=60)
        assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
        assert "'tokens' must be a list of token ids" in refused("/detokenize", {"tokens": "abc"})
        assert "outside the vocabulary" in refused("/detokenize", {"tokens": [1, 49152]})
        assert "outside the vocabulary" in refused("/detokenize", {"tokens": [-1]})
        ids = plain_ref.tokenizer("hello <|im_end|> world")["input_ids"]
        r = httpx.post(f"{base}/detokenize", json={"tokens": ids}, timeout=60)
        assert r.status_code == 200 and r.json() == {"prompt": plain_ref.tokenizer.decode(ids)}
        assert "<|im_end|>" in r.json()["prompt"]  # special tokens kept, as vLLM's decode keeps them
