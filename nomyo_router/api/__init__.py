"""The APIs' shapes: requests parsed and validated into one `GenRequest`, errors in the caller's
API shape, listings, client keys and their admission; the server's HTTP plumbing is `server/`."""
