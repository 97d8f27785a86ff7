"""The read and operate side: stats, history, running messages, dead letters and the delayed queue's views."""
