"""calque control plane: share AWS GPU instances among an institution's people."""

__version__ = "0.1.0"
