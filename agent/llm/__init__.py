"""Language-model clients: OpenAI-compatible chat completions and Anthropic Messages, behind one interface."""
