"""Shared building blocks every stage may use, and the only part of tasks/ the service may import (with config and
contract)."""
