"""Zero-shot probes that score the model's own outputs: CLIP prompts and towers, the runner."""
