//! A simulated vLLM engine: continuous batching, paged KV cache, preemption, OpenAI API and /metrics
