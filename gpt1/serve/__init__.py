"""`gpt1 serve`: a fine-tuned run or a pretrained checkpoint behind an HTTP API.

- `engine`: what is computed (predict / score / generate on one loaded model), no HTTP;
- `batcher`: the worker thread that owns the model, with dynamic batching and a bounded queue;
- `schemas`: request bodies and limits; `metrics`: Prometheus counters and histograms;
- `app`: the FastAPI routes, error handling and the body-size guard;
- `completions` (with `completion_schemas`, `completion_text`): the OpenAI-compatible endpoints;
- `server`: `serve(...)`, the entry point that runs it under uvicorn.
"""
