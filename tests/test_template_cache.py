"""A chat template is compiled once and reused: each render still gets its own messages, tokens and tools."""

from __future__ import annotations

import pytest

from specgguf.errors import PromptError
from specgguf.llama import vocab

TEMPLATE = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
OTHER = "{% for m in messages %}[{{ m.content }}]{% endfor %}{% if tools %}{{ tools | length }} tools{% endif %}"


def test_a_template_is_compiled_once_and_each_render_is_its_own():
    vocab._formatter.cache_clear()
    first = vocab.render_template(TEMPLATE, [{"role": "user", "content": "hi"}], eos="</s>", bos="<s>", name="m")
    again = vocab.render_template(TEMPLATE, [{"role": "user", "content": "yo"}], eos="</s>", bos="<s>", name="m")
    assert (first, again) == ("<s><user>hi</s>", "<s><user>yo</s>")
    assert vocab._formatter.cache_info().hits == 1 and vocab._formatter.cache_info().misses == 1
    # Other special tokens or another template: compiled apart, never the first one's output.
    other_tokens = vocab.render_template(TEMPLATE, [{"role": "user", "content": "hi"}], eos="<e>", bos="<b>", name="m")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    other = vocab.render_template(OTHER, [{"role": "user", "content": "hi"}], eos="", bos="", name="m", tools=tools)
    assert (other_tokens, other) == ("<b><user>hi<e>", "[hi]1 tools")


def test_a_template_that_does_not_compile_is_one_error_each_time():
    for _ in range(2):
        with pytest.raises(PromptError, match="chat template failed"):
            vocab.render_template("{% for %}", [{"role": "user", "content": "hi"}], eos="", bos="", name="m")
