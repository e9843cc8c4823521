"""KRATOS admission: application-aware GPU admission for Kubernetes."""

__version__ = "0.1.0"
