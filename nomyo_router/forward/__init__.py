"""A request's way to a backend and back: the proxy (admission, attempts, retries) and how an
answer is relayed to the client (whole, passed through, record by record, resumed).

It stands between the APIs' shapes (`api`, which it answers in) and the backend client
(`upstream`, which it drives), so neither of those imports the other's caller.
"""
