"""Float64 recomputation of the target's logits at a divergence (``--reference DIR``).

The prompt's token ids come from the spec-off server's own ``POST /tokenize`` (so the chat
template is the one the server applied), the generated prefix from the spec-off tokens
(ids, via vLLM's ``return_tokens_as_token_ids``). The model is the float64 target of
orchestration/reference_target.py, loaded once on the CPU.
"""

from __future__ import annotations

from specadapt.adapters.base import Server
from specadapt.analysis.identity import token_id
from specadapt.errors import SpecadaptError
from specadapt.orchestration.reference_target import ReferenceTarget
from specadapt.records import Divergence, Prompt, RequestRecord, Triage
from specadapt.wire.http import Wire
from specadapt.wire.openai import parse_tokenize, tokenize_body


class ReferenceScorer(ReferenceTarget):
    """The float64 target (orchestration/reference_target.py) judging a divergence by its true margin."""

    def prompt_ids(self, server: Server, prompt: Prompt) -> list[int]:
        """The prompt's ids by the spec-off server's own /tokenize (its chat template)."""
        with Wire.for_server(server, timeout_s=60) as wire:
            return parse_tokenize(wire.post_json("/tokenize", tokenize_body(prompt, server.model_id)))

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
        except SpecadaptError as exc:
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
