"""The API fuzzed from its own OpenAPI document: Schemathesis generates valid and invalid
requests for every operation the server documents and sends them to a real `gpt1 serve` (uvicorn)
on a tiny fine-tuned run (every route: predict, generate, score, completions, tokenizer, info).

Each answer must be: no server error (5xx), a status the document lists for that operation, the
documented content type, a body that conforms to the documented schema, and, for a schema-invalid
request, a refusal. On the OpenAI-compatible paths every error is OpenAI's error object; on the
native ones `{"error": "<one line>"}`. A new route or field is covered the day it is documented.

Not checked: that every schema-valid request is accepted (Schemathesis's positive-data check).
Many refusals are not expressible in a schema (a prompt longer than the model's window, a token id
outside its vocabulary, a stop list with guided_choice): those are 422s by design.

`make test` sends a slice (12 examples per operation); `make fuzz` at least 2,000 in all.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.core.failures import FailureGroup  # noqa: E402
from schemathesis.specs.openapi import checks as openapi_checks  # noqa: E402
from test_serve import kind_cases, serving, tiny_run  # noqa: E402

from gpt1.serve.openai.routes import PATHS as OPENAI_PATHS  # noqa: E402
from helpers.fuzzing import budget, report  # noqa: E402
from helpers.tiny import char_vocab  # noqa: E402

pytestmark = pytest.mark.fuzz

CHECKS = [
    not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
    openapi_checks.response_headers_conformance,
    openapi_checks.negative_data_rejection,
]
PER_OPERATION = budget(12, 350)  # seven operations take bodies: 2,450 requests in all


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    root = tmp_path_factory.mktemp("schema_fuzz")
    task, spec, _, _ = kind_cases()["single"]
    run = tiny_run(root / "run", char_vocab(root / "vocab"), task, spec)
    with serving(run) as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
        yield url, schema


def error_shape_problem(path: str, status: int, text: str) -> str | None:
    """Why an error answer is not in its protocol's shape (None when it is)."""
    if status < 400:
        return None
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return "not a JSON object with an 'error'"
    if path in OPENAI_PATHS:
        fields = {"message", "type", "param", "code"}
        if not isinstance(error, dict) or set(error) != fields or error["code"] != status:
            return f"not OpenAI's error object: {error!r}"
        message = error["message"]
    else:
        if not isinstance(error, str):
            return f"not a one-line string: {error!r}"
        message = error
    if "\n" in message or "Traceback" in message or "sys.set_int_max_str_digits" in message:
        return f"message is not one line for people: {message!r}"
    return None


def test_every_documented_operation_under_generated_requests(served):
    """Every operation of /openapi.json, valid and invalid bodies: 0 server errors, 0 answers
    outside the document, 0 errors outside their protocol's shape."""
    url, schema = served
    sent, statuses = 0, collections.Counter()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/predict", "/v1/completions", "/v1/score"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def send(case: Any) -> None:
            nonlocal sent
            headers = {"Content-Type": "application/json"} if case.body is not None else None
            response = case.call(base_url=url, headers=headers, timeout=120)
            sent += 1
            statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except (Exception, FailureGroup) as exc:  # noqa: BLE001 - findings, listed below
                failures.append(f"{operation.label}: {str(exc)[:600]}")
            problem = error_shape_problem(operation.path, response.status_code, response.text)
            if problem:
                failures.append(f"{operation.label} [{response.status_code}]: {problem}")

        send()
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    report(
        "API from its schema",
        requests=sent,
        operations=len(operations),
        server_errors=server_errors,
        violations=len(failures),
    )
    assert not failures, "\n".join(failures[:10])
    assert server_errors == 0 and sent >= len(operations)


def test_the_document_lists_the_gate_answers_for_every_operation(served):
    """401, 403 (and 415 for a body) are answers any operation can give before it runs: the
    document says so, so a client generated from it knows them."""
    url, schema = served
    document = schema.raw_schema
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if path in ("/", "/docs", "/favicon.ico"):
                continue
            assert {"401", "403"} <= set(operation["responses"]), (method, path)
            if "requestBody" in operation:
                assert "415" in operation["responses"], (method, path)
