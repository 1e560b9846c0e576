"""Harnesses users can use too: broken and single-stream media made from a good file."""
