"""The security tests' throwaway PKI and helpers (tests/pki.py)."""

from pki import make_spans, no_ca_bundle_env, otlp_http_server, pki, rotate  # noqa: F401
