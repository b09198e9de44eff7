"""Stand-ins for what the local stack cannot run: an OpenAI/vLLM simulator, metadata servers."""
