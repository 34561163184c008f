"""OpenAI's Responses API over the same engine: POST /v1/responses (text in and out,
`instructions`, whole or as its streaming semantic events) and `previous_response_id` within the
server's memory (the last 256 stored responses). Function tools (`tools`, `tool_choice`; calls as
`function_call` output items, results as `function_call_output` input items) and `text.format`
(json_object, json_schema) go through the same engine path and grammar as chat completions. The
request body is in bodies.py, the response and event shapes in shape.py. Errors are OpenAI's
shape, as on the other /v1 routes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request

from ....conversation import Message, ToolCall
from ...common import ApiError, ServeOptions, check_model, parse_body
from ...generator import Delta, Failed, Finished, Job, Worker
from ...jobs import Answer, answer, messages, set_up, stream
from ...plan import GenerationRequest, Limits, RequestPrompt, RequestSampling
from ...tools import CallDelta
from .bodies import ResponsesBody
from .shape import Shape, call_item_id

MEMORY = 256  # stored responses a later request may continue from

ENDPOINTS: tuple[str, ...] = ("/v1/responses",)
ERROR_PREFIXES: tuple[str, ...] = ("/v1/responses", "/responses")


def error_body(error: ApiError) -> dict:
    """OpenAI's error shape, as on the other /v1 routes."""
    return error.body()


def add_routes(app: FastAPI, *, worker: Worker, options: ServeOptions, dependencies: list) -> None:
    memory: OrderedDict[str, list[Message]] = OrderedDict()

    @app.post("/v1/responses", dependencies=dependencies)
    @app.post("/responses", dependencies=dependencies)
    async def create(request: Request):
        body: ResponsesBody = parse_body(ResponsesBody, await request.body())
        check_model(options, body.model)
        history: list[Message] = []
        if body.previous_response_id is not None:
            if body.previous_response_id not in memory:
                raise ApiError(
                    400,
                    f"Previous response with id {body.previous_response_id[:100]!r} not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = [turn for turn in memory[body.previous_response_id] if turn.role != "system"]
        turns = history + body.turns(history)
        system = [Message("system", body.instructions)] if body.instructions else []
        # Off the event loop: a grammar's first compilation may take up to grammar.COMPILE_SECONDS.
        grammar, tools = await set_up(lambda: (body.grammar(), body.tool_plan(history)))
        generation = GenerationRequest(
            RequestPrompt(system + turns),
            RequestSampling(body.sampling(options.settings)),
            Limits(body.max_output_tokens or options.max_tokens),
            grammar=grammar,
            tools=tools,
        )
        reply = await answer(worker, generation, request, stream=bool(body.stream))
        shape = Shape(body, options.model_name)

        def remember(text: str, calls: list[ToolCall]) -> None:
            if body.store is not False:
                said = (
                    text if text.strip() or not calls else ""
                )  # as the output has it: blank text before calls is none
                memory[shape.id] = [*turns, Message("assistant", said, tuple(calls))]
                while len(memory) > MEMORY:
                    memory.popitem(last=False)

        if isinstance(reply, Answer):
            remember(reply.text, reply.finished.tool_calls)
            return shape.response(reply.text, reply.finished)
        return stream(_events(shape, reply, remember))


async def _events(shape: Shape, job: Job, remember: Callable[[str, list[ToolCall]], None]) -> AsyncIterator[str]:
    yield shape.event("response.created", response=shape.response("", None))
    yield shape.event("response.in_progress", response=shape.response("", None))
    items = _Items(shape)
    async for message in messages(job):
        if isinstance(message, Delta):
            for event in items.text(message.text) + [e for delta in message.tool_calls for e in items.call(delta)]:
                yield event
        elif isinstance(message, Finished):
            for event in items.close(message.tool_calls, cut=message.finish_reason == "length"):
                yield event
            remember(items.whole, message.tool_calls)
            final = shape.response(items.whole, message)
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield shape.event(kind, response=final)
        elif isinstance(message, Failed):
            yield shape.event("error", code="server_error", message=str(message.error), param=None)


class _Items:
    """The stream's output items as they come: the message when its text comes (blank text held back,
    dropped if a call comes next), a function_call item per call, each closed when the next opens."""

    def __init__(self, shape: Shape):
        self.shape = shape
        self.index = -1
        self.open: ToolCall | str | None = None  # "message", or the call whose item is open
        self.whole = ""  # the message's text
        self.blank = ""

    def _close(self, calls: list[ToolCall], *, cut: bool = False) -> list[str]:
        shape, at = self.shape, {"output_index": self.index}
        if self.open == "message":
            where = {"item_id": shape.item_id, **at, "content_index": 0}
            events = [
                shape.event("response.output_text.done", **where, text=self.whole, logprobs=[]),
                shape.event("response.content_part.done", **where, part=shape.part(self.whole)),
                shape.event("response.output_item.done", **at, item=shape.item(self.whole, done=True)),
            ]
        elif isinstance(self.open, ToolCall):
            call = next((c for c in calls if c.id == self.open.id), self.open)
            events = [
                shape.event(
                    "response.function_call_arguments.done",
                    item_id=call_item_id(call.id),
                    **at,
                    name=call.name,
                    arguments=call.arguments,
                ),
                shape.event("response.output_item.done", **at, item=shape.call_item(call, done=True, cut=cut)),
            ]
        else:
            events = []
        self.open = None
        return events

    def text(self, text: str) -> list[str]:
        if not (self.blank + text).strip():
            self.blank += text
            return []
        delta, self.blank = self.blank + text, ""
        return self._say(delta)

    def _say(self, delta: str) -> list[str]:
        """`delta` as the message's text, the message opened first if it is not."""
        shape, events = self.shape, []
        if self.open != "message":
            events, self.open = self._close([]), "message"
            self.index += 1
            item = shape.item("", done=False)
            events.append(shape.event("response.output_item.added", output_index=self.index, item=item))
            where = {"item_id": shape.item_id, "output_index": self.index, "content_index": 0}
            events.append(shape.event("response.content_part.added", **where, part=shape.part("")))
        self.whole += delta
        if delta:
            where = {"item_id": shape.item_id, "output_index": self.index, "content_index": 0}
            events.append(shape.event("response.output_text.delta", **where, delta=delta, logprobs=[]))
        return events

    def call(self, delta: CallDelta) -> list[str]:
        shape, events = self.shape, []
        if delta.id is not None:
            self.blank = ""
            events = self._close([])
            self.open, self.index = ToolCall(delta.id, delta.name or "", ""), self.index + 1
            item = shape.call_item(self.open, done=False)
            events.append(shape.event("response.output_item.added", output_index=self.index, item=item))
        if delta.arguments and isinstance(self.open, ToolCall):
            self.open = ToolCall(self.open.id, self.open.name, self.open.arguments + delta.arguments)
            events.append(
                shape.event(
                    "response.function_call_arguments.delta",
                    item_id=call_item_id(self.open.id),
                    output_index=self.index,
                    delta=delta.arguments,
                )
            )
        return events

    def close(self, calls: list[ToolCall], *, cut: bool) -> list[str]:
        """The end: blank text not yet sent (or an empty message, if nothing came); the last item
        closes (`cut`: by max_output_tokens)."""
        events = self._say(self.blank) if self.blank or self.index < 0 else []
        self.blank = ""
        return events + self._close(calls, cut=cut)
