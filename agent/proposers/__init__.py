"""The proposers: where the next kernel comes from (llm, search, replay)."""
