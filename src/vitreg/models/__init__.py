"""Model loading, adapters and token layout."""
