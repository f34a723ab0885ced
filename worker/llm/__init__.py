"""LLM functions: thaw's own function code for a pushed causal LM.

``engine`` runs transformers' continuous batching (one manager per replica);
``detokenize`` turns the cumulative token ids of a stream into text deltas.
"""
