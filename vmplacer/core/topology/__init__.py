"""core/topology: the host's CPU and memory topology: reading it and who uses each pCPU."""
