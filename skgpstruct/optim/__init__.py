"""Optimisers on plain callables; they know nothing of GPs."""

from .lbfgs import OptimizationResult, minimize_lbfgs

__all__ = ["OptimizationResult", "minimize_lbfgs"]
