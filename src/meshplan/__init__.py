"""meshplan: predict and plan how large ML models run on accelerator clusters."""

__version__ = "0.1.0"
