"""The server side of the router's HTTP: uvicorn's httptools protocol with bounds per
connection (`protocol.py`), the corked and direct writes of a response (`body_writer.py`,
`direct_writer.py`), the ASGI helpers every handler uses (`asgi.py`), the byte budget of
queued bodies (`body_budget.py`) and the loop's idle spin (`idle_spin.py`)."""
