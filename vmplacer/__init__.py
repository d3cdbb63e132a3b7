"""vmplacer: interference-aware placement of libvirt/KVM guests."""

__version__ = "0.1.0"
