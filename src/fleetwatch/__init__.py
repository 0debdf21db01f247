"""FleetWatch: GPU fleet health monitoring and failure prediction."""

__version__ = "0.1.0"

__all__ = ["__version__"]
