"""A request's way to a backend: the proxy (attempts, retries, which way out of `relay/` writes
the answer), what is sent to the backend, and the wrappers around the proxy (ensembles,
trim-and-retry). The answer itself leaves through the request's `Exchange` (relay/exchange.py).

It stands above the relay (the ways out, which it chooses), the APIs' shapes and the backend
client, so none of those imports its caller.
"""
