"""Model building blocks: LoRA-aware linear, RMSNorm, rotary embeddings."""
