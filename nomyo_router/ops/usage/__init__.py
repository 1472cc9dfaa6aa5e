"""Usage: what each request consumed (tokens, time), kept (store), reported (routes) and streamed live (stream)."""
