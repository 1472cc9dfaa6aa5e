"""The running router's wiring: every long-lived component built once, each with what it needs
in its constructor (`router.py`), started and stopped in order (the lifespan, `lifespan.py`),
the handlers off the request path built on first use (`handlers.py`), a new config applied
(`reconfigure.py`), and the process's own concerns: event-loop lag (`loop_lag.py`), the
garbage collector's pacing (`gc_pacing.py`).

Nothing here is imported by the layers below; the app (`app.py`) reaches the router only
through this package.
"""
