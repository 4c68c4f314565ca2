"""Treadle: a Kubernetes-native control plane for agentic RL rollout of LLMs."""

__version__ = "0.1.0"
