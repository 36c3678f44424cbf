"""Integrations of flashattn with other libraries (each imports its library lazily)."""
