"""The version of hookscope: one place, read by the package, the command line and the report."""

__version__ = "0.1.0"
