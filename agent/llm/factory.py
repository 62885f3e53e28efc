"""Which model, where, with which key: from options, settings (KERNELLOOP_LLM_*) and the usual variables.

OpenAI dialect: OPENAI_BASE_URL, OPENAI_MODEL, OPENAI_API_KEY (OPENROUTER_API_KEY for an openrouter.ai
base URL). Anthropic: ANTHROPIC_BASE_URL, ANTHROPIC_MODEL, ANTHROPIC_API_KEY. A server on this machine or
a private network (vLLM, Ollama) needs no key; a hosted API without one is refused before the run starts.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlparse

from kernelloop.agent.llm.anthropic_messages import AnthropicMessagesClient
from kernelloop.agent.llm.openai_chat import OpenAIChatClient
from kernelloop.agent.llm.types import ChatClient, LlmFailure
from kernelloop.agent.models import ApiStyle, LlmConfig
from kernelloop.agent.settings import AgentSettings

DEFAULT_BASE_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
ENV_BASE_URL = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}
ENV_MODEL = {"openai": "OPENAI_MODEL", "anthropic": "ANTHROPIC_MODEL"}
ENV_KEY = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
SETTINGS_KEY_ENV = "KERNELLOOP_LLM_API_KEY"


def configured_model(api: ApiStyle, model: str | None, settings: AgentSettings) -> str | None:
    """The model named by the option, KERNELLOOP_LLM_MODEL or OPENAI_MODEL/ANTHROPIC_MODEL, if any."""
    return model or settings.llm_model or os.environ.get(ENV_MODEL[api]) or None


def resolve_llm_config(
    *, api: ApiStyle | None, base_url: str | None, model: str | None, api_key_env: str | None, settings: AgentSettings
) -> LlmConfig | LlmFailure:
    api = api or settings.llm_api
    chosen_model = configured_model(api, model, settings)
    if not chosen_model:
        return LlmFailure(
            kind="bad_request",
            message="no model is configured for the llm proposer",
            fix=f"give --model NAME (or set KERNELLOOP_LLM_MODEL or {ENV_MODEL[api]}); without a model, "
            "use --proposer search",
        )
    url = base_url or settings.llm_base_url or os.environ.get(ENV_BASE_URL[api]) or DEFAULT_BASE_URL[api]
    if not urlparse(url).scheme.startswith("http"):
        return LlmFailure(
            kind="bad_request",
            message=f"the model API base URL {url!r} is not an http(s) URL",
            fix="give --base-url like http://localhost:8000/v1 (vLLM) or https://openrouter.ai/api/v1",
        )
    key_env = api_key_env or _default_key_env(api, url, settings)
    # the KERNELLOOP_LLM_* settings are the config's fields by name (llm_max_tokens: max_tokens); what was resolved
    # above from the options and the usual variables wins
    configured = {
        name: getattr(settings, f"llm_{name}")
        for name in LlmConfig.model_fields
        if f"llm_{name}" in AgentSettings.model_fields
    }
    resolved = {"api": api, "base_url": url, "model": chosen_model, "api_key_env": key_env}
    config = LlmConfig.model_validate(configured | resolved)
    if api_key(config, settings) is None and not is_private_url(url):
        where = f"${key_env}" if key_env else f"${ENV_KEY[api]}"
        return LlmFailure(
            kind="no_api_key",
            message=f"no API key for {url} ({where} is not set)",
            fix=f"export {key_env or ENV_KEY[api]}=... (or KERNELLOOP_LLM_API_KEY, or name another variable "
            "with --api-key-env); a local server (vLLM, Ollama) needs none",
        )
    return config


def _default_key_env(api: ApiStyle, url: str, settings: AgentSettings) -> str:
    if settings.llm_api_key is not None:
        return SETTINGS_KEY_ENV
    if "openrouter.ai" in url and os.environ.get("OPENROUTER_API_KEY"):
        return "OPENROUTER_API_KEY"
    return ENV_KEY[api]


def api_key(config: LlmConfig, settings: AgentSettings) -> str | None:
    if config.api_key_env == SETTINGS_KEY_ENV and settings.llm_api_key is not None:
        return settings.llm_api_key.get_secret_value()
    return os.environ.get(config.api_key_env) if config.api_key_env else None


def is_private_url(url: str) -> bool:
    """A server on this machine or a private network: vLLM, Ollama, a test server."""
    host = urlparse(url).hostname or ""
    if host in ("localhost",) or host.endswith(".local"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private


def make_chat_client(config: LlmConfig, settings: AgentSettings) -> ChatClient:
    hint = f" (${config.api_key_env})" if config.api_key_env else ""
    kind = AnthropicMessagesClient if config.api == "anthropic" else OpenAIChatClient
    return kind(config, api_key(config, settings), key_hint=hint)
