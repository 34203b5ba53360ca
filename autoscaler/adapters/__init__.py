"""Adapters between the decision core's ports and real systems (Prometheus, Kubernetes)."""
