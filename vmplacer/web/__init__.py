"""The operator's read-only web view at /ui/: a fleet page and a page per host, signed in
with an API token kept in a cookie, served by the same application (and the same app
services) as the REST API."""
