"""The one room for prompts: messages -> the model's chat template (or ChatML) -> tokens.

Every command builds its prompt here, so `run`, `chat`, `bench` and `serve` cannot disagree:

- A GGUF with a chat template gets it; a GGUF without one gets ChatML in every command
  (llama.cpp's fallback too: `llama-cli` and `llama-server` render ChatML for such a model).
  `run --raw` and the server's `/v1/completions` send text as is, no template at all; `run --raw`
  parses the special tokens written in it (`<|im_start|>`...) as llama.cpp's programs do, unless
  `--no-special`.
- Text that continues a prompt is tokenized without the BOS a tokenizer puts in front.
- A conversation's history is kept as the very tokens that were generated, not a
  re-tokenized copy of their text (a tokenizer need not give the same ids back), so the
  engine's prefix reuse finds the whole history in both models' KV caches.
- `PromptCache` keeps the last prompt + answer as text and tokens, for the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from .errors import PromptError

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class Message:
    """One message of a conversation, typed; `as_template` is what a chat template reads."""

    role: Role
    content: str

    def as_template(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class Templated(Protocol):
    """What the prompts need of the verifier (`llama.model.LlamaModel` is one)."""

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...

    def chat_template(self) -> str | None: ...

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str: ...


def chatml(messages: Sequence[Message]) -> str:
    """The template for a model whose GGUF carries none (llama.cpp's choice too)."""
    return "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


class Prompts:
    """Prompts for one verifier: rendered, tokenized, continued."""

    def __init__(self, verifier: Templated):
        self.verifier = verifier
        self.has_template = verifier.chat_template() is not None
        self._bos = verifier.tokenize("", special=True)  # what tokenize puts in front of any text

    def render(self, messages: Sequence[Message]) -> str:
        """The text of a prompt ready for the assistant's turn: the model's template, else ChatML.
        A failing or looping template raises PromptError (llama/template.py)."""
        if not self.has_template:
            return chatml(messages)
        return self.verifier.apply_chat_template([message.as_template() for message in messages])

    def tokens(self, text: str, *, special: bool = True) -> list[int]:
        """A whole prompt's tokens (BOS where the model wants one)."""
        return self.verifier.tokenize(text, special=special)

    def continuation(self, text: str, *, special: bool = True) -> list[int]:
        """Tokens for text that continues a prompt: no BOS in front."""
        tokens = self.verifier.tokenize(text, special=special)
        return tokens[len(self._bos) :] if self._bos and tokens[: len(self._bos)] == self._bos else tokens

    def question(self, prompt: str, *, raw: bool, system: str | None, special: bool = True) -> list[int]:
        """One question's prompt (`run`, `bench`): rendered with a system prompt, unless raw; raw text has
        its special tokens parsed (llama.cpp's programs do) unless not `special`."""
        if not prompt.strip():
            raise PromptError("the prompt is empty")
        if raw:
            return self.tokens(prompt, special=special)
        messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
        return self.tokens(self.render(messages), special=True)

    def history(self, system: str | None, turns: Sequence[tuple[str, list[int], str]], question: str) -> list[int]:
        """The prompt for `question` after `turns` of (question, answer tokens, answer text):
        earlier answers as the very tokens generated. A template that rewrites earlier turns
        falls back to tokenizing the whole text; the engine then reuses what still matches."""
        messages = [Message("system", system)] if system else []
        tokens: list[int] = []
        covered = ""  # the text `tokens` stand for
        for asked, answer_tokens, answer in [*turns, (question, [], "")]:
            messages.append(Message("user", asked))
            text = self.render(messages)
            if covered and text.startswith(covered):
                tokens += self.continuation(text[len(covered) :])
            else:  # the first turn, or a template that rewrote the history
                tokens = self.tokens(text)
            tokens += answer_tokens
            covered = text + answer
            messages.append(Message("assistant", answer))
        return tokens


class PromptCache:
    """The server's last prompt + answer as text and as the tokens that were really evaluated:
    a follow-up whose text extends it reuses those tokens, so the KV caches match."""

    def __init__(self, prompts: Prompts):
        self.prompts = prompts
        self.text, self.special = "", True
        self.tokens: list[int] = []

    def tokens_for(self, text: str, *, special: bool) -> list[int]:
        if self.text and special == self.special and text.startswith(self.text):
            return self.tokens + self.prompts.continuation(text[len(self.text) :], special=special)
        return self.prompts.tokens(text, special=special)

    def remember(self, text: str, tokens: list[int], *, special: bool) -> None:
        self.text, self.tokens, self.special = text, list(tokens), special

    def forget(self) -> None:
        self.remember("", [], special=True)
