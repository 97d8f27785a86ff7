"""The Lua scripts (``lua/``), the runner that loads and calls them, and the typed calls."""
