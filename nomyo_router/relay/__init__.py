"""How an answer travels to the client.

The request's `Exchange` (`exchange.py`) is its one way out and one completion point. Every
way out implements one interface (`base.Relay`), handed its answer by `Exchange.relay`:
`whole.py` (an answer in one write; a larger one relayed as it comes), `assembled.py` (a
whole answer the backend streamed), `passthrough.py` (a stream as it comes, carried by the
compiled pump when it can), `resumable.py` (record by record, resumed elsewhere when cut),
`translated.py` (an OpenAI backend's answer in the Ollama API's shape), `cached.py` (the
response cache's answer) and `exchange.Failed` (errors in the caller's API shape).

Their mechanics: the sinks a stream is relayed through (`sinks.py`), the compiled pump
(`pump.py` + `_pump.c`), resumption on another endpoint (`continuation.py`), whole answers
assembled from a stream (`whole_from_stream.py`), the deadlines that tell a slow answer from a hung
backend (`deadline.py`), which failures are retried (`retry.py`), and what the relayed bytes
say (`error_record.py`, `token_counts.py`)."""
