"""Task adapters: one module per task family (load, preprocess, postprocess, metrics)."""
