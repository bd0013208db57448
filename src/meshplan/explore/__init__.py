"""Spaces of plans → a cheap lower bound → exact evaluation of the candidates that can win."""
