"""lockstep: bit-exact, auditable language-model training."""

__version__ = "0.1.0"
