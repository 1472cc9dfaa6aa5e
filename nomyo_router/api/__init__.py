"""Where requests enter: the ASGI app's routes, request validation and error shapes."""
