"""Connections: the client, the topology, the Sentinel watch, server facts and permissions."""
