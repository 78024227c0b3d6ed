"""The imperative shell: kopf handlers, the Kubernetes API, server-side apply, status and events."""
