"""Optimisers on plain callables; they know nothing of GPs."""

from .lbfgs import OptimizationResult, minimize_lbfgs, minimize_lbfgs_rounds

__all__ = ["OptimizationResult", "minimize_lbfgs", "minimize_lbfgs_rounds"]
