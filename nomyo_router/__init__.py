"""nomyo-router: one address in front of many Ollama and OpenAI-compatible backends."""

__version__ = "0.1.0"
