"""A tool call cut short by max_tokens (its arguments not valid JSON yet),
echoed back by the client as it got it, renders on every API instead of
failing the conversation with a 400 (the template library parses every
call's arguments; thaw closes what was cut before it does)."""
import json
import os

import pytest

from harness import REPO, mkmodel

TEMPLATES = os.path.join(REPO, ".deps", "llama.cpp", "models", "templates")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                   "required": ["city"]}}}
CUT = ['{"city": "Par', '{"ci', '{"city": "Paris", ', '{"a": [1, {"b": "\\u00', 'not json']


@pytest.fixture(scope="module", params=["qwen3", "hermes3"])
def model(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("cut")
    if request.param == "qwen3":
        return mkmodel(d / "qwen3.gguf", "--arch", "qwen3", "--seed", "3")
    return mkmodel(d / "hermes3.gguf", "--arch", "llama", "--seed", "3", "--chat-template-file",
                   os.path.join(TEMPLATES, "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"))


@pytest.mark.parametrize("args", CUT)
def test_cut_arguments_render_on_all_apis(serve, model, args):
    s = serve(model)
    q = "Weather in Paris?"
    chat = {"messages": [{"role": "user", "content": q},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": args}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}],
            "tools": [WEATHER], "max_tokens": 2, "temperature": 0}
    r = s.post("/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    resp = {"input": [{"role": "user", "content": q},
                      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
                      {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}],
            "tools": [{"type": "function", **WEATHER["function"]}], "max_output_tokens": 2, "temperature": 0}
    r = s.post("/v1/responses", resp)
    assert r.status_code == 200, r.text
    # Anthropic carries input as an object, so what thaw sends back for a
    # cut call is its best repair; what arrives here is always valid JSON
    msgs = {"messages": [{"role": "user", "content": q},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                                            "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                       "content": "Sunny"}]}],
            "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}], "max_tokens": 2}
    r = s.post("/v1/messages", msgs)
    assert r.status_code == 200, r.text


def test_a_call_cut_by_max_tokens_continues(serve, model):
    """The real flow: a forced call cut by max_tokens, its reply echoed back."""
    s = serve(model)
    conv = [{"role": "user", "content": "Weather in Paris?"}]
    r = s.post("/v1/chat/completions", {"messages": conv, "tools": [WEATHER], "tool_choice": "required",
                                        "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    conv.append(msg)
    for c in msg.get("tool_calls") or []:
        conv.append({"role": "tool", "tool_call_id": c["id"], "content": "Sunny"})
    if not msg.get("tool_calls"):
        conv.append({"role": "user", "content": "And London?"})
    r = s.post("/v1/chat/completions", {"messages": conv, "tools": [WEATHER], "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    json.dumps(r.json())
