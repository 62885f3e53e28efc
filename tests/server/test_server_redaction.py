"""The service removes its own secrets from what a job sends back, wherever in the result they appear."""

from __future__ import annotations

from kernelloop.server.redaction import REDACTED, Redactor, service_secrets
from kernelloop.tools.results import CompileResult, Diagnostic, Status


def test_secrets_are_found_in_the_token_the_database_url_and_key_like_variables() -> None:
    found = service_secrets(
        "token-1234567890",
        "postgresql://kl:db-password-42@localhost/kl",
        {"OPENAI_API_KEY": "sk-abcdefghij", "HOME": "/root/not-a-secret", "MY_TOKEN": "short"},
    )
    assert set(found) == {"token-1234567890", "db-password-42", "sk-abcdefghij"}


def test_a_result_carrying_a_secret_comes_back_without_it() -> None:
    secret = "token-1234567890"
    result = CompileResult(
        status=Status.compile_error,
        problem="causal_conv1d",
        backend="cpu",
        message=f"the key is {secret}",
        log=f'env: KERNELLOOP_API_TOKEN="{secret}"\n',
        diagnostics=[Diagnostic(severity="error", tool="python", message=f"NameError: {secret}")],
    )
    clean = Redactor([secret])(result)

    assert secret not in clean.model_dump_json()
    assert clean.message == f"the key is {REDACTED}" and REDACTED in clean.log
    assert clean.diagnostics[0].message == f"NameError: {REDACTED}"
    assert Redactor([secret])(clean) is clean  # nothing left to remove: the same object
