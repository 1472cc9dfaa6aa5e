"""The response cache: an answer given once is given again, without a backend, to a request
that asks for it (opt-in) and matches it exactly (or, in semantic mode, closely enough).

- `keys.py`: who opted in, and the key of what they ask (canonical JSON of the whole request);
- `answer.py`: what is kept of an answer: its text, tool calls and counts, whatever shape it
  came in, so a stream can answer a whole request and the other way round;
- `render.py`: a kept answer in the request's API shape, whole or streamed;
- `stores.py`, `redis_store.py`: where answers are kept (memory, SQLite, Redis);
- `service.py`: the request flow (look up, answer or capture and store), its counters;
- `semantic.py`: the embedding of a question and the nearest kept one;
- `routes.py`: `GET /api/cache/stats`, `POST /api/cache/clear`.
"""
