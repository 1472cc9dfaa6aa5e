"""Load tester for nomyo-router and any Ollama/OpenAI-compatible server."""
