"""One queue over several masters: the layout, the router, and the views and consumer folded over the shards."""
