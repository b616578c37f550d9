"""`gpt1 serve`: a fine-tuned run or a pretrained checkpoint behind an HTTP API.

- `engine`: what is computed (predict / score / generate on one loaded model), no HTTP;
- `batcher`: the worker thread that owns the model, with dynamic batching and a bounded queue;
- `schemas`: request bodies and limits; `metrics`: Prometheus counters and histograms;
- `app`: `create_app`, the FastAPI app: its routers, error handlers and lifespan;
- `routes`: the native endpoints (predict, generate, score, health, metrics, docs) as routers;
- `state`: what the handlers share (engine, batcher, metrics, limits, tokenizer thread);
- `guard`: the middleware around the app (body size and arrival time, request metrics);
- `responses`: refusals as one line of JSON;
- `events`: the server-sent-event responses both protocols stream;
- `openai/`: OpenAI's protocol (/v1/completions, /v1/models, the tokenizer endpoints);
- `options`: `ServeOptions`, the server's settings; `server`: `serve(...)`, the entry point that
  runs it under uvicorn.
"""
