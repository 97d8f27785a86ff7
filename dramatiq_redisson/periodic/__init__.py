"""Periodic actors: the schedule specification and the schedules kept on the server."""
