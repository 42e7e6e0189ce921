"""Integrations with model libraries: ``xsync.integrations.transformers`` registers xsync's
attention as ``attn_implementation="xsync"`` for Hugging Face transformers."""
