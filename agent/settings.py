"""The agent's settings: which service it talks to, and the language model's API. Same KERNELLOOP_ variables
and .env as the other layers; the model's key and the service's token live here and nowhere below."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernelloop.tools.settings import ENV_FILE, ENV_PREFIX


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=ENV_FILE, extra="ignore")

    data_dir: Path = Field(Path(".kernelloop"), description="run folders (the best kernel of each run) live here")
    server_url: str | None = Field(
        None, description="the service `kernelloop agent` uses; None: it starts one embedded on a loopback port"
    )
    api_token: SecretStr | None = Field(None, description="the service's bearer token, sent with every call")
    reconnect_s: float = Field(
        300.0,
        ge=0,
        description="how long `kernelloop agent` waits for a service that stops answering (restarted, say) before "
        "the run ends; 0: not at all",
    )
    heartbeat_s: float = Field(
        30.0,
        gt=0,
        description="how often a running agent tells the service its run is alive (the service marks a run it has "
        "not heard from for KERNELLOOP_RUN_TIMEOUT_S interrupted)",
    )
    llm_api: Literal["openai", "anthropic"] = Field("openai", description="the model API's dialect")
    llm_base_url: str | None = Field(
        None, description="the model API; default: OPENAI_BASE_URL (ANTHROPIC_BASE_URL), else the vendor's own"
    )
    llm_model: str | None = Field(
        None, description="the model; default: OPENAI_MODEL (ANTHROPIC_MODEL); with none, the agent runs the search"
    )
    llm_api_key: SecretStr | None = Field(
        None, description="the model API key; default: OPENAI_API_KEY (ANTHROPIC_API_KEY, OPENROUTER_API_KEY)"
    )
    llm_max_tokens: int = Field(8192, ge=256, description="longest model reply, tokens")
    llm_context_chars: int = Field(120_000, ge=8_000, description="conversation kept before older turns are summarized")
    llm_timeout_s: float = Field(300.0, gt=0, description="one model call")
    llm_max_retries: int = Field(
        5, ge=0, le=20, description="retries of a model call on 429, 5xx and dropped connections"
    )

    @field_validator("server_url")
    @classmethod
    def _service_url(cls, url: str | None) -> str | None:
        """A service's address is an http(s) URL with a host: anything else is refused at once, not waited for as
        an outage."""
        if url is None or not url.strip():
            return None
        parts = urlsplit(url.strip())
        try:
            parts.port  # noqa: B018 - a port that is not a number raises here
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not the URL of a service: give http://HOST:PORT (e.g. http://gpu-box:8000)")
        return url.strip()

    @field_validator("api_token", "llm_api_key")
    @classmethod
    def _blank_is_none(cls, secret: SecretStr | None) -> SecretStr | None:
        return secret if secret is not None and secret.get_secret_value().strip() else None
