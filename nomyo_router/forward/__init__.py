"""A request's way to a backend and back: the one way out of its answer (`exchange.py`: the
`Exchange`, whose `finish` is the request's one completion point), the proxy (attempts,
retries, which relay), the relays behind the Exchange (`relays/`: whole, passed through,
record by record and resumed, translated), and the wrappers around the proxy (ensembles,
trim-and-retry).

It stands between the APIs' shapes (`api`, which it answers in) and the backend client
(`upstream`, which it drives), so neither of those imports the other's caller.
"""
