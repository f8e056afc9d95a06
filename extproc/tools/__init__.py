"""Tools around the gateway that prove a migration: the offline probe and shadow mode."""
