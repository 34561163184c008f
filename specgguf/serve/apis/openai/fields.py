"""The fields of OpenAI's requests that have no meaning for a local server, accepted and ignored
(so that clients which always send them work), and those that would change the answer and are
not done here, refused by name. docs/serve.md lists both.

Ignored: `store`, `metadata`, `service_tier`, `user`, `safety_identifier`, `prompt_cache_key`,
`prompt_cache_retention`, `prompt_cache_options` (common.AccountFields, which the Responses API
shares; prompts are cached anyway), `reasoning_effort`
and `verbosity` (hints for OpenAI's reasoning models), `prediction` (a latency hint: the answer is
the same without it), `stream_options.include_obfuscation`, `modalities: ["text"]`, `audio: null`,
and, in messages, `refusal: null`, `annotations` and `audio: null` (what the openai SDK sends back
of an answer). Refused: `modalities` with "audio", `audio` output, `web_search_options`,
`moderation`, and an assistant message's `audio` reference. llama-server's own fields, which its
clients send here too, are common.LlamaServerFields.
"""

from __future__ import annotations

from typing import Any, Literal

from ...common import Body, unsupported


class ChatIgnored(Body):
    """Chat only: accepted; `refuse_chat_extras` refuses the values that would change the answer."""

    reasoning_effort: str | None = None
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None


class MessageFields(Body):
    """What an answer's message carries besides its role and content, as the SDK sends it back."""

    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: Any = None

    def refuse_extras(self, where: str) -> None:
        if self.audio is not None:
            raise unsupported(f"{where}.audio", "no audio")
        if self.function_call is not None:
            raise unsupported(f"{where}.function_call", "no tool calls")


def refuse_chat_extras(request: ChatIgnored) -> None:
    if request.modalities and "audio" in request.modalities:
        raise unsupported("modalities", 'only ["text"]')
    if request.audio is not None:
        raise unsupported("audio", "no audio output")
    if request.web_search_options is not None:
        raise unsupported("web_search_options", "no web search")
    if request.moderation is not None:
        raise unsupported("moderation", "no moderation")
