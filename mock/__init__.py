"""A fake Ollama/OpenAI backend with a capacity model, a KV prefix cache and fault injection."""

from .config import MockConfig
from .runner import MockProcess, RunningMock, free_port, run_mock, start_mock
from .server import MockBackend

__all__ = ["MockBackend", "MockConfig", "MockProcess", "RunningMock", "free_port", "run_mock", "start_mock"]
