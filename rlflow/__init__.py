"""rlflow: learn to make neural-network graphs run faster by verified graph rewriting."""

__version__ = "0.1.0"
