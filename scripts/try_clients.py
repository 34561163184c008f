"""Third-party clients' structured-output and tool paths against a running `specgguf serve`: instructor
(TOOLS, JSON and JSON_SCHEMA modes), pydantic-ai (a typed output and a tool), litellm (tools and a
pydantic `response_format`). They are not in the test extras (each pins its own openai/httpx), so run
this from a virtual environment of its own, against a server on 127.0.0.1:

    python -m venv /tmp/clients && /tmp/clients/bin/pip install instructor "pydantic-ai-slim[openai]" litellm
    specgguf serve --port 8080 &
    /tmp/clients/bin/python scripts/try_clients.py --url http://127.0.0.1:8080

One line per client: OK and what it got, or FAIL and the error. Exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import httpx
from pydantic import BaseModel

PROMPT = "Alan Turing: give his name and the year he was born."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class Person(BaseModel):
    name: str
    born: int


def instructor_modes(url: str, model: str) -> dict:
    import instructor
    from openai import OpenAI

    answers = {}
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(OpenAI(base_url=url + "/v1", api_key="unused"), mode=mode)
        person = client.chat.completions.create(
            model=model,
            response_model=Person,
            max_retries=0,
            messages=[{"role": "user", "content": PROMPT}],
            temperature=0,
        )
        answers[mode.value] = person.model_dump()
    return answers


def _pydantic_ai_model(url: str, model: str):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(model, provider=OpenAIProvider(base_url=url + "/v1", api_key="unused"))


def pydantic_ai_output(url: str, model: str) -> dict:
    from pydantic_ai import Agent

    return Agent(_pydantic_ai_model(url, model), output_type=Person).run_sync(PROMPT).output.model_dump()


def pydantic_ai_tool(url: str, model: str) -> dict:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(url, model), system_prompt="Use the tool to answer.")
    cities: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Weather for a city."""
        cities.append(city)
        return f"sunny, 21 C in {city}"

    result = agent.run_sync("What's the weather in Paris?")
    if not cities:
        raise RuntimeError(f"the model answered without calling the tool: {str(result.output)[:100]!r}")
    return {"tool called with": cities, "answer": str(result.output)[:100]}


def litellm_calls(url: str, model: str) -> dict:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else it fetches a price list from GitHub
    import litellm

    common = {"model": "openai/" + model, "api_base": url + "/v1", "api_key": "unused", "temperature": 0}
    weather = [{"role": "user", "content": "What's the weather in Paris?"}]
    call = litellm.completion(messages=weather, tools=[WEATHER], **common).choices[0].message.tool_calls[0]
    answer = litellm.completion(messages=[{"role": "user", "content": PROMPT}], response_format=Person, **common)
    return {
        "tools": (call.function.name, call.function.arguments),
        "response_format": json.loads(answer.choices[0].message.content),
    }


CLIENTS: dict[str, Callable[[str, str], dict]] = {
    "instructor": instructor_modes,
    "pydantic-ai output_type": pydantic_ai_output,
    "pydantic-ai tool": pydantic_ai_tool,
    "litellm": litellm_calls,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    args = parser.parse_args()
    model = httpx.get(args.url + "/v1/models").json()["data"][0]["id"]
    failed = False
    for name, client in CLIENTS.items():
        try:
            print(f"OK   {name}: {client(args.url, model)}")
        except Exception as error:  # a client's own exception types: each is reported, none stops the rest
            failed = True
            print(f"FAIL {name}: {type(error).__name__}: {str(error)[:300]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
