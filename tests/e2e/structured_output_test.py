"""Structured outputs end to end on SmolLM2-135M-Instruct: a local cluster (cluster.py: one
prefill node samples token 0 under the grammar, one decode node replays it into its matcher
and continues) answers the official `openai` client with JSON mode, a nested JSON schema
(validated by the `jsonschema` package, never by our own code), streaming, guided_choice and
guided_regex — at temperature 1 over several seeds; a bad schema is a 400 naming the field.

    cd tests/e2e && HACK_BUILD_DIR=../../build python3 -m unittest -v structured_output_test
"""

import concurrent.futures
import json
import os
import re
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ.setdefault("HACK_MODEL", os.path.join(SOURCE_DIR, "models", "smollm2-135m-instruct"))

try:
    import jsonschema
    import openai
except ImportError as e:  # a failure, not a skip: CI must have them
    raise ImportError("`openai` and `jsonschema` are needed: pip install -r scripts/requirements-test.txt") from e

import cluster

MODEL = os.path.basename(cluster.MODEL_DIR)
SEEDS = range(1, 7)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0},
        "height_m": {"type": "number"},
        "pet": {"enum": ["cat", "dog", "none"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 15}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "height_m", "pet", "address", "hobbies"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a fictional person as JSON: name, age, height in meters, pet, "
                                   "address (city and zip) and hobbies."}]


class StructuredOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster.Cluster(prefill=1, decode=1, threads=1)
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.cluster.router.port}/v1", api_key="none",
                                   max_retries=0, timeout=300)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def parallel(self, fn, args):
        # Concurrent requests share decode steps (the decode node batches them).
        with concurrent.futures.ThreadPoolExecutor(len(args)) as pool:
            return list(pool.map(fn, args))

    def test_json_mode_is_always_a_json_object(self):
        def ask(seed):
            return self.client.chat.completions.create(
                model=MODEL, messages=ASK, temperature=1.0, seed=seed, max_tokens=200,
                response_format={"type": "json_object"})
        finished = 0
        for seed, r in zip(SEEDS, self.parallel(ask, list(SEEDS))):
            choice = r.choices[0]
            if choice.finish_reason == "length":
                continue  # cut short by max_tokens: no server can promise a whole object
            finished += 1
            with self.subTest(seed=seed):
                self.assertIsInstance(json.loads(choice.message.content), dict, choice.message.content)
        self.assertGreaterEqual(finished, 3)

    def test_nested_schema_validates_every_time(self):
        def ask(seed):
            return self.client.chat.completions.create(
                model=MODEL, messages=ASK, temperature=1.0, seed=seed, max_tokens=300,
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                        "strict": True}})
        for seed, r in zip(SEEDS, self.parallel(ask, list(SEEDS))):
            with self.subTest(seed=seed):
                choice = r.choices[0]
                self.assertEqual(choice.finish_reason, "stop", choice.message.content)
                jsonschema.validate(json.loads(choice.message.content), PERSON)

    def test_streamed_deltas_concatenate_to_valid_json(self):
        stream = self.client.chat.completions.create(
            model=MODEL, messages=ASK, temperature=1.0, seed=11, max_tokens=300, stream=True,
            extra_body={"guided_json": PERSON})
        text, finish = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(finish, "stop")
        jsonschema.validate(json.loads(text), PERSON)

    def test_guided_choice_and_regex(self):
        choices = ["positive", "negative", "neutral"]

        def ask_choice(seed):
            return self.client.chat.completions.create(
                model=MODEL, temperature=1.0, seed=seed, max_tokens=10,
                messages=[{"role": "user", "content": "Sentiment of 'I love this movie'?"}],
                extra_body={"guided_choice": choices})

        def ask_regex(seed):
            return self.client.completions.create(
                model=MODEL, prompt="The phone number of the office is", temperature=1.0, seed=seed, max_tokens=20,
                extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})

        for r in self.parallel(ask_choice, [1, 2, 3]):
            self.assertIn(r.choices[0].message.content, choices)
        for r in self.parallel(ask_regex, [1, 2, 3]):
            self.assertRegex(r.choices[0].text, r"^\(\d{3}\) \d{3}-\d{4}$")
            self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_bad_constraints_are_400_naming_the_field(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(
                model=MODEL, messages=ASK, max_tokens=5,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": {"type": "integer", "multipleOf": 3}}})
        self.assertIn("multipleOf", str(e.exception))
        self.assertEqual(e.exception.body.get("param"), "response_format")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=MODEL, prompt="x", max_tokens=5,
                                           extra_body={"guided_regex": "a", "guided_choice": ["b"]})
        self.assertIn("only one", str(e.exception))
        # The cluster keeps serving.
        r = self.client.completions.create(model=MODEL, prompt="x", max_tokens=3, extra_body={"guided_choice": ["ok"]})
        self.assertEqual(r.choices[0].text, "ok")


if __name__ == "__main__":
    unittest.main()
