"""Which endpoint serves a request: the model index, the policies and the scheduler."""
