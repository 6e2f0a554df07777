"""The adapters of external code (Liger, transformers, FlashInfer, vLLM, SGLang) against the reference."""
