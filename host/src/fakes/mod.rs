//! Fake LLM providers (OpenAI-compatible, Anthropic, Gemini) steered by the upstream model name.
