"""What the router knows of its backends: their type, models and health (`discovery.py`,
`health.py`, `model_sync.py`), the APIs they speak and how one is turned into the other
(`translate.py`, `stream_lines.py`), and the model-management calls (`management_session.py`,
`progress.py`, `unload.py`). Requests reach them through the HTTP client, `h1`."""
