"""app/protect: the protection loop on one host."""
