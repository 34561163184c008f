"""Agents against a live server on the default pair (Qwen2.5-Coder 1.5B + 0.5B): the openai SDK's tools,
streamed tool calls and `parse`, LangChain's `ChatOpenAI.bind_tools`, and the OpenAI Agents SDK running
a two-tool agent loop over chat completions."""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
import pytest
from pydantic import BaseModel

from live_server import live_server

pytestmark = [pytest.mark.qwen, pytest.mark.slow]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
PARIS = [{"role": "user", "content": "What's the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def server(qwen_pair):
    verifier, draft = qwen_pair
    with live_server("-m", verifier, "-md", draft, "--temp", "0", "-n", "160", startup_timeout=240) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_openai_sdk_tool_call_whole_and_streamed(client, model):
    response = client.chat.completions.create(model=model, messages=PARIS, tools=[WEATHER])
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert "paris" in arguments["city"].lower()
    # The grammar's forced tokens (the one tool's name) are drafted free when a step starts where the
    # grammar forces text; a draft model's step may run over them (credited to "model"), so where the
    # steps start depends on the adaptive K. One draft a step puts a step start inside every forced
    # span of two or more tokens.
    one = client.chat.completions.create(
        model=model, messages=PARIS, tools=[WEATHER], extra_body={"speculative": {"k": 1}}
    )
    assert [call.function.name for call in one.choices[0].message.tool_calls] == ["get_weather"]
    assert one.model_extra["timings"]["draft_n_accepted_by_source"].get("grammar", 0) > 0
    streamed: dict[int, dict] = {}
    for chunk in client.chat.completions.create(model=model, messages=PARIS, tools=[WEATHER], stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = streamed.setdefault(delta.index, {"name": delta.function.name, "arguments": ""})
            entry["arguments"] += delta.function.arguments or ""
    assert streamed == {0: {"name": "get_weather", "arguments": call.function.arguments}}


def test_tool_choice_none_is_a_plain_answer(client, model):
    # The prompt is rendered without the tools (the model wants to call one here), and nothing
    # constrains or parses a call: the answer is text, not a call written as text.
    response = client.chat.completions.create(
        model=model, messages=PARIS, tools=[WEATHER], tool_choice="none", max_tokens=80
    )
    choice = response.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert choice.message.content and "tool_call" not in choice.message.content
    assert response.model_extra["timings"]["draft_n_accepted_by_source"].get("grammar", 0) == 0


class City(BaseModel):
    name: str
    country: str
    population_millions: float


def test_a_required_call_bills_the_tokens_it_returns(client, model):
    # Around the call the grammar allows no indent: at T = 0.8 Qwen had written 20 spaces before
    # </tool_call> in 2 of 6 seeds (48 tokens billed for a 29-token call). What is billed now is the
    # call as the template writes it, give or take its envelope's own layout (a blank line, a space,
    # `{"name"` pretty-printed: a few tokens).
    for seed in range(6):
        response = client.chat.completions.create(
            model=model, messages=PARIS, tools=[WEATHER], tool_choice="required", temperature=0.8, seed=seed
        )
        (call,) = response.choices[0].message.tool_calls
        written = (
            f'<tool_call>\n{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}\n</tool_call>\n'
        )
        as_prompt = client.completions.create(model=model, prompt=written, max_tokens=1).usage.prompt_tokens
        assert as_prompt <= response.usage.completion_tokens <= as_prompt + 6, seed


def test_openai_sdk_parse_fills_a_pydantic_model(client, model):
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe Paris as JSON: name, country, population in millions."}],
        response_format=City,
    )
    city = completion.choices[0].message.parsed
    assert isinstance(city, City) and city.name == "Paris" and city.country == "France"


def test_langchain_bind_tools(server, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=model, base_url=server.base_url + "/v1", api_key="unused", temperature=0, max_retries=0)
    message = llm.bind_tools([get_weather]).invoke("What's the weather like in Paris right now?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    assert "paris" in message.tool_calls[0]["args"]["city"].lower()


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_openai_agents_sdk_runs_a_two_tool_loop(server, model, tool_choice):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        StopAtTools,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current temperature in a city, in degrees Celsius."""
        called.append("get_weather")
        return f"It is 20 degrees Celsius in {city}."

    @function_tool
    def to_fahrenheit(celsius: float) -> str:
        """Convert a temperature from degrees Celsius to degrees Fahrenheit."""
        called.append("to_fahrenheit")
        return f"{celsius * 9 / 5 + 32:g} degrees Fahrenheit"

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    agent = Agent(
        name="weather",
        instructions="Use the tools: first get_weather, then to_fahrenheit on its result.",
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        tools=[get_weather, to_fahrenheit],
        # auto: the 1.5B coder, left to choose, writes its call bare in the doubled braces its template
        # shows (`{{"name": …}}}`), a form the hermes syntax opens and parses (serve/tool_syntax.py);
        # required: every turn calls a tool. The loop ends with the conversion's result.
        model_settings=ModelSettings(tool_choice=tool_choice),
        reset_tool_choice=False,
        tool_use_behavior=StopAtTools(stop_at_tool_names=["to_fahrenheit"]),
    )
    result = Runner.run_sync(agent, "How warm is it in Paris, in Fahrenheit?", max_turns=6)
    assert called == ["get_weather", "to_fahrenheit"]
    assert result.final_output == "68 degrees Fahrenheit"  # 20 °C, read back from the first tool's answer
