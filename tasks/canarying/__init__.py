"""The progressive canary: its pure analysis, what it observes of a service, and the steps it drives."""
