"""REST API for orchestrators: `create_app` (vmplacer.api.app), served by `vmplacer serve`."""
