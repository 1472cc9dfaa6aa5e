"""The strategies behind the `Exchange` (forward/exchange.py): how one attempt's answer is
relayed to the client, one module each, chosen by `Proxy._attempt`.

- `whole.py`: an answer in one piece (held, then one write), or a larger one relayed as it comes;
- `assembled.py`: a whole answer the backend was asked to stream: collected, then one write;
- `passthrough.py`: a stream relayed as its bytes come (the sink, then the compiled pump);
- `resumable.py`: a stream relayed record by record, continued on another endpoint when cut;
- `translated.py`: an OpenAI backend's answer in the Ollama API's shape, whole or streamed.

Each writes only through the Exchange (`start`, `body`, `end`, `whole`) and notes there what
the client got (`cut`, `tokens`); none releases a slot or tells an event: `Exchange.finish` does.
"""
