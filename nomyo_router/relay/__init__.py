"""How an answer travels from a backend to the client: the sinks a stream is relayed through
(`sinks.py`), the compiled pump (`pump.py` + `_pump.c`), resumption on another endpoint
(`resume.py`), whole answers assembled from a stream (`assemble.py`), the deadlines that tell
a slow answer from a hung backend (`deadline.py`), which failures are retried (`retry.py`),
and what the relayed bytes say (`error_record.py`, `token_counts.py`)."""
