"""Float64 recomputation of the target's logits at a divergence (``--reference DIR``).

The prompt's token ids come from the spec-off server's own ``POST /tokenize`` (so the chat
template is the one the server applied), the generated prefix from the spec-off tokens
(ids, via vLLM's ``return_tokens_as_token_ids``). The model is loaded once, in float64 on
the CPU, with transformers.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from specadapt.adapters.base import Server
from specadapt.analysis.identity import token_id
from specadapt.errors import UsageError, require
from specadapt.orchestration.triage import post_json
from specadapt.records import Divergence, Prompt, RequestRecord, Triage


class ReferenceScorer:
    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise UsageError(f"--reference {model_dir} is not a local HF model directory (no config.json)")
        self._model = None

    def _load(self):
        if self._model is None:
            purpose = "--reference (float64 recomputation)"
            torch = require("torch", "reference", purpose)
            transformers = require("transformers", "reference", purpose)
            transformers.utils.logging.disable_progress_bar()
            self._torch = torch
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                str(self.model_dir), dtype=torch.float64).eval()
        return self._model

    def prompt_ids(self, server: Server, prompt: Prompt) -> list[int]:
        body: dict = {"model": server.model_id}
        if prompt.api == "chat":
            body.update(messages=[m.model_dump() for m in prompt.messages or []], add_generation_prompt=True)
        else:
            body["prompt"] = prompt.prompt
        resp = post_json(server, "/tokenize", body, 60)
        resp.raise_for_status()
        return [int(t) for t in resp.json()["tokens"]]

    def margin(self, prefix: list[int], off_id: int, on_id: int) -> float:
        """logp(off) - logp(on) for the next token after ``prefix``, in float64."""
        model = self._load()
        torch = self._torch
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].to(torch.float64)
        logp = torch.log_softmax(logits, dim=-1)
        return float(logp[off_id] - logp[on_id])

    def triage(self, server: Server, prompt: Prompt, div: Divergence, off: RequestRecord,
               threshold: float, server_triage: Triage | None) -> Triage:
        base = server_triage or Triage(verdict="unknown", source="none", threshold=threshold)
        ids = [token_id(t) for t in off.tokens[:div.token_index]]
        off_id = token_id(div.off_token or "")
        on_id = token_id(div.on_token or "")
        if div.token_index < 0 or None in ids or off_id is None or on_id is None:
            return base.model_copy(update={"note": (base.note + "; " if base.note else "")
                                           + "reference not used: the server gave no token ids"})
        try:
            prefix = self.prompt_ids(server, prompt) + ids
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            return base.model_copy(update={"note": (base.note + "; " if base.note else "")
                                           + f"reference not used: /tokenize failed ({type(exc).__name__})"})
        m = self.margin(prefix, off_id, on_id)
        verdict = "near-tie" if abs(m) < threshold else "suspect"
        note = base.note
        if m < 0:
            note = (note + "; " if note else "") + "float64 prefers the spec-on token: the spec-off server is the one that flipped"
        return Triage(verdict=verdict, source="reference-float64", margin=m, threshold=threshold,
                      server_margin=base.server_margin, reference_margin=m, top_logprobs=base.top_logprobs,
                      margin_is_lower_bound=False, note=note)
