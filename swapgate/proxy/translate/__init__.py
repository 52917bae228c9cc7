"""Between APIs: an Anthropic Messages or OpenAI Responses request served by an upstream that
speaks only chat completions, and its answer carried back (docs/compatibility.md)."""
