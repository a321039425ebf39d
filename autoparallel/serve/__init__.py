"""Serving (inference) layouts: candidate space, latency-bounded search, exports, validation."""
