"""/v1/responses end to end on SmolLM2-135M-Instruct: the official `openai` client's
`client.responses.create(...)` against a local cluster (cluster.py: 1 prefill + 1 decode node and
a router).

- Text, whole and streamed: the streamed events come in the order the client parses
  (response.created … response.completed, consecutive sequence_numbers, each named on its
  own "event:" line as OpenAI sends them), their deltas add up to
  the whole response's text, and greedy text equals what /v1/chat/completions answers for the
  same conversation (instructions as its system message, a list input as its messages) — the
  Responses API is a translation of the chat path, so the tokens must be the same.
- A function tool round trip as the official docs write it: the model's function_call items go
  back into `input` as they came, with a function_call_output each, and the model answers in
  text. tool_choice "required" and a named function force calls (arguments checked with
  `jsonschema`).
- text.format json_schema: output validated with `jsonschema` at temperature 1 over several seeds.
- What is not served — previous_response_id, store, background, image input, hosted tools,
  retrieving a stored response — is a 400 (BadRequestError), and the router keeps serving.

    cd tests/e2e && HACK_BUILD_DIR=../../build python3 -m unittest -v responses_api_test
"""

import concurrent.futures
import json
import os
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ.setdefault("HACK_MODEL", os.path.join(SOURCE_DIR, "models", "smollm2-135m-instruct"))

try:
    import jsonschema
    import openai
except ImportError as e:  # a failure, not a skip: CI must have them
    raise ImportError("`openai` and `jsonschema` are needed: pip install -r scripts/requirements-test.txt") from e

import cluster  # noqa: E402  (reads HACK_MODEL)

MODEL = os.path.basename(cluster.MODEL_DIR.rstrip("/"))
SEEDS = range(1, 5)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME_TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"]},
}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
        "country": {"type": "string", "minLength": 1, "maxLength": 20},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}

# The order of a text answer's events, as OpenAI sends them and the client parses them.
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done"]


def weather_history(city):
    """Three questions answered by a get_weather call, in Responses items, then one for `city`
    (the 135M model then repeats the call pattern under greedy decoding, as in tools_api_test)."""
    items = [{"role": "system", "content": "You are a helpful assistant. Always call a tool to answer."}]
    for i, known in enumerate(("Paris", "Berlin", "Madrid")):
        items += [
            {"role": "user", "content": f"What is the weather in {known}?"},
            {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
             "arguments": json.dumps({"city": known})},
        ]
    items.append({"role": "user", "content": f"What is the weather in {city}?"})
    return items


class ResponsesApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.isfile(os.path.join(cluster.MODEL_DIR, "model.safetensors")):
            raise RuntimeError(f"{cluster.MODEL_DIR} is missing: run scripts/fetch-models.sh")
        cls.cluster = cluster.Cluster(prefill=1, decode=1)
        cls.client = openai.OpenAI(base_url=f"http://{cls.cluster.router.address}/v1", api_key="none",
                                   max_retries=0, timeout=180)  # 2 shared CI cores

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def stream_events(self, **kwargs):
        events = list(self.client.responses.create(stream=True, **kwargs))
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        self.assertEqual(events[0].type, "response.created")
        self.assertEqual(events[0].response.status, "in_progress")
        self.assertIn(events[-1].type, ("response.completed", "response.incomplete"))
        return events

    def test_stream_names_each_event(self):
        # As OpenAI's stream: every event's "event:" line names the type its data carries.
        import urllib.request
        body = json.dumps({"model": MODEL, "input": "Say hi.", "stream": True, "max_output_tokens": 8,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{self.cluster.router.address}/v1/responses", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=180) as r:
            raw = r.read().decode()
        blocks = [b for b in raw.split("\n\n") if b.strip()]
        self.assertGreater(len(blocks), 3, raw)
        for block in blocks:
            lines = block.split("\n")
            self.assertTrue(lines[0].startswith("event: "), block)
            data = json.loads("\n".join(line[len("data: "):] for line in lines[1:]))
            self.assertEqual(lines[0][len("event: "):], data["type"])

    def chat_text(self, messages, max_tokens):
        r = self.client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens)
        return r.choices[0].message.content

    def test_instructions_whole_and_streamed(self):
        ask = dict(model=MODEL, instructions="You are a geography teacher. Answer in one sentence.",
                   input="What is the capital of France?", temperature=0, max_output_tokens=40)
        r = self.client.responses.create(**ask)
        self.assertTrue(r.id.startswith("resp_"))
        self.assertEqual(r.object, "response")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(r.instructions, ask["instructions"])
        self.assertIn(r.status, ("completed", "incomplete"))
        self.assertTrue(r.output_text.strip())
        self.assertEqual(r.output[0].type, "message")
        self.assertEqual(r.output[0].role, "assistant")
        self.assertGreater(r.usage.input_tokens, 0)
        self.assertTrue(0 < r.usage.output_tokens <= 40)
        self.assertEqual(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens)
        # The instructions are the system message of the chat it runs as.
        self.assertEqual(r.output_text, self.chat_text(
            [{"role": "system", "content": ask["instructions"]}, {"role": "user", "content": ask["input"]}], 40))

        events = self.stream_events(**ask)
        types = [e.type for e in events]
        self.assertEqual([t for t in dict.fromkeys(types)][:len(TEXT_EVENTS)], TEXT_EVENTS, types)
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        done = [e for e in events if e.type == "response.output_text.done"]
        self.assertEqual(len(done), 1)
        self.assertEqual(deltas, done[0].text)
        self.assertEqual(deltas, r.output_text)
        final = events[-1].response
        self.assertEqual(final.output_text, r.output_text)
        self.assertEqual(final.usage.output_tokens, r.usage.output_tokens)
        self.assertEqual(events[-1].type, "response.completed" if r.status == "completed" else "response.incomplete")

    def test_message_list_input(self):
        items = [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": [{"type": "input_text", "text": "Name a colour of the sky."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
            {"role": "user", "content": "And of grass?"},
        ]
        r = self.client.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=30)
        self.assertTrue(r.output_text.strip())
        self.assertEqual(r.output_text, self.chat_text(
            [{"role": "system", "content": "You are a concise assistant."},
             {"role": "user", "content": "Name a colour of the sky."},
             {"role": "assistant", "content": "Blue."},
             {"role": "user", "content": "And of grass?"}], 30))
        # Cut off by max_output_tokens: incomplete, with the reason.
        short = self.client.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=2)
        self.assertEqual(short.status, "incomplete")
        self.assertEqual(short.incomplete_details.reason, "max_output_tokens")
        self.assertEqual(short.usage.output_tokens, 2)

    def test_function_tool_round_trip(self):
        items = weather_history("London")
        r = self.client.responses.create(model=MODEL, input=items, tools=[WEATHER_TOOL], temperature=0,
                                         max_output_tokens=40)
        self.assertEqual(r.status, "completed")
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual(len(calls), 1, r.output)
        self.assertEqual(calls[0].name, "get_weather")
        self.assertTrue(calls[0].call_id.startswith("call_"))
        self.assertTrue(calls[0].id.startswith("fc_"))
        self.assertIn("city", json.loads(calls[0].arguments))
        self.assertNotIn("<tool_call>", r.output_text)

        # Streamed: the arguments' deltas assemble to the same call (greedy: the same tokens).
        events = self.stream_events(model=MODEL, input=items, tools=[WEATHER_TOOL], temperature=0,
                                    max_output_tokens=40)
        added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
        self.assertEqual([a.name for a in added], ["get_weather"])
        self.assertEqual(added[0].arguments, "")
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        self.assertEqual(args, calls[0].arguments)
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        self.assertEqual([d.arguments for d in done], [calls[0].arguments])

        # As the official docs loop: the output goes back into input as it came, with the result.
        items += r.output
        items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "Rainy, 12 C"})
        final = self.client.responses.create(model=MODEL, input=items, tools=[WEATHER_TOOL], temperature=0,
                                             max_output_tokens=30)
        self.assertFalse([o for o in final.output if o.type == "function_call"], final.output)
        self.assertTrue(final.output_text.strip())

    def test_tool_choice_required_and_named(self):
        plain = "Write one sentence about cats."
        finished = 0
        for seed in SEEDS:
            r = self.client.responses.create(model=MODEL, input=plain, tools=[WEATHER_TOOL, TIME_TOOL],
                                             tool_choice="required", parallel_tool_calls=False, temperature=1,
                                             max_output_tokens=80, extra_body={"seed": seed})
            if r.status == "incomplete":
                continue  # a long city name: cut off, nothing to check
            finished += 1
            calls = [o for o in r.output if o.type == "function_call"]
            self.assertEqual(len(calls), 1, r.output)
            tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[calls[0].name]
            jsonschema.validate(json.loads(calls[0].arguments), tool["parameters"])
        self.assertGreaterEqual(finished, 2)
        r = self.client.responses.create(model=MODEL, input=plain, tools=[WEATHER_TOOL, TIME_TOOL],
                                         tool_choice={"type": "function", "name": "get_time"}, temperature=0,
                                         max_output_tokens=80)
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual([c.name for c in calls], ["get_time"])
        jsonschema.validate(json.loads(calls[0].arguments), TIME_TOOL["parameters"])
        self.assertEqual(r.tool_choice.name, "get_time")

    def test_json_schema_output(self):
        fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
        ask = "Describe a large city as JSON: its name, its country and its population."

        def create(seed):
            return self.client.responses.create(model=MODEL, input=ask, text=fmt, temperature=1.0,
                                                max_output_tokens=120, extra_body={"seed": seed})

        with concurrent.futures.ThreadPoolExecutor(len(SEEDS)) as pool:
            results = list(pool.map(create, SEEDS))
        finished = 0
        for seed, r in zip(SEEDS, results):
            if r.status == "incomplete":
                continue  # cut short: no server can promise a whole object
            finished += 1
            with self.subTest(seed=seed):
                jsonschema.validate(json.loads(r.output_text), CITY)
                self.assertEqual(r.text.format.type, "json_schema")
        self.assertGreaterEqual(finished, 2)
        events = self.stream_events(model=MODEL, input=ask, text=fmt, temperature=0, max_output_tokens=120)
        if events[-1].type == "response.completed":
            jsonschema.validate(json.loads(events[-1].response.output_text), CITY)

    def test_unsupported_is_400_and_the_router_keeps_serving(self):
        refused = [
            dict(input="x", previous_response_id="resp_0123"),
            dict(input="x", store=True),
            dict(input="x", background=True),
            dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://127.0.0.1/x.png"}]}]),
            dict(input="x", tools=[{"type": "web_search"}]),
            dict(input="x", max_output_tokens=10 ** 8),  # past the context: the chat path's 400, param renamed
        ]
        params = ["previous_response_id", "store", "background", "input.[0].content.[0].type", "tools.[0].type", "input"]
        for kwargs, param in zip(refused, params):
            with self.subTest(param=param):
                with self.assertRaises(openai.BadRequestError) as e:
                    self.client.responses.create(model=MODEL, **kwargs)
                self.assertEqual(e.exception.status_code, 400)
                self.assertEqual(e.exception.body["param"], param)
                self.assertTrue(e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.responses.retrieve("resp_0123")
        self.assertIn("keeps no responses", e.exception.body["message"])
        with self.assertRaises(openai.BadRequestError):
            self.client.responses.delete("resp_0123")
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.create(model="no-such-model", input="x")
        r = self.client.responses.create(model=MODEL, input="Say hi.", temperature=0, max_output_tokens=8)
        self.assertTrue(r.output_text)


if __name__ == "__main__":
    unittest.main()
