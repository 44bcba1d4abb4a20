"""One request's input: a completion prompt or a chat conversation."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class Prompt(BaseModel):
    """One request's input. Exactly one of ``prompt`` (completions) or ``messages`` (chat)."""

    model_config = ConfigDict(extra="forbid")
    id: str = ""
    category: str = Field("default", description="Group for per-category figures, e.g. grounded/open.")
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int | None = Field(None, gt=0, description="Overrides --max-tokens for this prompt.")
    grounding: Literal["input-grounded", "open"] | None = Field(
        None, description="input-grounded: the answer copies much of the input (drafts match often); open: it does not.")
    turns: list[str] | None = Field(
        None, description="Multi-turn conversations (chat only): the user's later turns, each sent after the "
                          "server's own answer to the previous one.")

    @model_validator(mode="after")
    def _one_kind(self) -> Prompt:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' (completions) or 'messages' (chat)")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("'prompt' is empty")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' is empty")
        if self.turns is not None:
            if self.messages is None:
                raise ValueError("'turns' needs 'messages' (multi-turn conversations use the chat API)")
            if not self.turns or any(not t.strip() for t in self.turns):
                raise ValueError("'turns' must be a list of non-empty user messages")
        return self

    @property
    def api(self) -> Literal["chat", "completions"]:
        return "chat" if self.messages is not None else "completions"

    def text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.content for m in self.messages or [])
