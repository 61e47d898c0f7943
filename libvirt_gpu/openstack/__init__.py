"""The OpenStack side: Placement (provider tree, client, sync), our
Cyborg driver, the agent."""
