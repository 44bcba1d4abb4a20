"""The target recomputed in float64 on the CPU from a local HF model directory (``--reference
DIR``), for `equiv --sampling`, the distribution cells of `equiv --features` and the triage of
`equiv` (orchestration/reference_check.py): the one place torch and transformers are loaded."""

from __future__ import annotations

import copy
from pathlib import Path

from specadapt.analysis.sampling_check import Sample
from specadapt.analysis.sampling_stats import TokenDraw
from specadapt.errors import UsageError, require
from specadapt.records import Prompt

PROMPT_STATES = 8  # prompts whose float64 state the reference keeps


class ReferenceTarget:
    """The target recomputed in float64 on the CPU (``--reference DIR``): its tokenizer gives
    prompt ids when no source server does, its log-softmax the top K at each sampled position
    (``score``, ``logprob_rows``) and the true margin of two tokens after a prefix (``margin``).
    torch and transformers are imported on first use."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise UsageError(f"--reference {model_dir} is not a local HF model directory (no config.json)")
        self._model = None
        self._tokenizer = None
        self._prompts: dict = {}  # prompt ids -> (log-probabilities after them, their KV cache)

    def _transformers(self):
        """transformers, with torch as ``self._torch`` (MissingDependency naming the extra when absent)."""
        purpose = "--reference (float64 recomputation)"
        self._torch = require("torch", "reference", purpose)
        transformers = require("transformers", "reference", purpose)
        transformers.utils.logging.disable_progress_bar()
        return transformers

    def tokenize(self, prompt: Prompt) -> list[int]:
        if self._tokenizer is None:
            self._tokenizer = self._transformers().AutoTokenizer.from_pretrained(str(self.model_dir))
        tok = self._tokenizer
        if prompt.api == "chat":
            if not tok.chat_template:
                raise UsageError(f"--reference {self.model_dir} has no chat template: give completion prompts "
                                 "('prompt') or a model with one")
            out = tok.apply_chat_template([m.model_dump() for m in prompt.messages or []],
                                          add_generation_prompt=True, tokenize=True)
            ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
            return [int(t) for t in ids]
        return [int(t) for t in tok(prompt.prompt)["input_ids"]]

    def _load(self):
        if self._model is None:
            transformers = self._transformers()
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                str(self.model_dir), dtype=self._torch.float64).eval()
        return self._model

    def _prompt_state(self, prompt_ids: tuple[int, ...]):
        """(log-probabilities after the prompt, the prompt's KV cache), computed once per prompt and kept
        for the last ``PROMPT_STATES`` prompts: the samples of a prompt share it, so only their own tokens
        are run (and a run that samples the same prompts at several settings computes each once)."""
        state = self._prompts.pop(prompt_ids, None)
        if state is None:
            torch = self._torch
            with torch.no_grad():
                out = self._load()(torch.tensor([list(prompt_ids)]), use_cache=True)
            state = (torch.log_softmax(out.logits[0, -1:].to(torch.float64), dim=-1), out.past_key_values)
        self._prompts[prompt_ids] = state  # the most recent last
        while len(self._prompts) > PROMPT_STATES:
            self._prompts.pop(next(iter(self._prompts)))
        return state

    def _rows(self, sample: Sample):
        """The target's float64 log-probabilities ``[n, V]`` (torch): row j is the distribution of sampled
        token j."""
        model = self._load()
        torch = self._torch
        first, cache = self._prompt_state(sample.prompt_ids)
        rows = [first]
        if len(sample.tokens) > 1:
            with torch.no_grad():
                out = model(torch.tensor([list(sample.tokens[:-1])]), past_key_values=copy.deepcopy(cache),
                            use_cache=True)
            rows.append(torch.log_softmax(out.logits[0].to(torch.float64), dim=-1))
        return torch.cat(rows)

    def logprob_rows(self, sample: Sample):
        """``_rows`` as a numpy array (the raw distribution at every sampled position)."""
        return self._rows(sample).numpy()

    def score(self, sample: Sample, k: int) -> list[TokenDraw]:
        logp = self._rows(sample)
        torch = self._torch
        values, indices = torch.topk(logp, k, dim=-1)
        draws = []
        for j, token in enumerate(sample.tokens):
            top = {int(t): float(v) for t, v in zip(indices[j].tolist(), values[j].tolist())}
            draws.append(TokenDraw(top=top, token=token, logprob=float(logp[j, token]), position=j,
                                   prompt_id=sample.prompt_id))
        return draws

    def margin(self, prefix: list[int], off_id: int, on_id: int) -> float:
        """logp(off) - logp(on) for the next token after ``prefix``, in float64 (logits a model gives
        in float32 are taken to float64 before the softmax)."""
        model = self._load()
        torch = self._torch
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].to(torch.float64)
        logp = torch.log_softmax(logits, dim=-1)
        return float(logp[off_id] - logp[on_id])
