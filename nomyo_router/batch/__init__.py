"""The OpenAI Batch API on idle capacity: files and batches kept durably (`store.py`), read
from uploads and input files (`intake.py`), shaped as OpenAI's objects (`objects.py`), served
by `routes.py`, run line by line on slots interactive requests leave free (`runner.py`);
`service.py` holds them for one process."""
