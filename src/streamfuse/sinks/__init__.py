"""Sinks: stages at the end of the graph that render events (JSON Lines, collectors)."""

from streamfuse.sinks.base import CollectSink, EventSink
from streamfuse.sinks.jsonl import JsonlSink

__all__ = ["CollectSink", "EventSink", "JsonlSink"]
