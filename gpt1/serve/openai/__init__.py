"""OpenAI's protocol, spoken by `gpt1 serve` beside its own API: the endpoints the OpenAI SDK,
vLLM's clients and lm-evaluation-harness's `local-completions` call.

- `routes`: `/v1/completions`, `/v1/models`, `/tokenize`, `/detokenize`, `/tokenizer_info` (a
  module-level router the app includes; its handlers take the app's `ServeState`);
- `schemas`: the request bodies, OpenAI's fields and defaults;
- `choices`: a completion's choices, computed (generated or scored) and written in OpenAI's shape;
- `stream`: a streamed completion's chunks (server-sent events, `gpt1.serve.events`);
- `text`: a completion's text as GPT-1's tokenizer writes it: pieces, offsets, stop strings;
- `guided`: `guided_choice`, the likeliest of listed strings;
- `errors`: every refusal and failure in OpenAI's error object.

The rest of the server (the engine, the batcher, the limits) is shared with the native API.
"""
