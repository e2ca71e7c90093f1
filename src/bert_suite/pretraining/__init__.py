"""Pre-training: corpus -> documents -> NSP instances; masking collator."""
