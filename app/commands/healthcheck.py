"""`stepwatch healthcheck`: probe this instance's /healthz on the metrics endpoint the config names
(file, STEPWATCH_* environment), for a container HEALTHCHECK that follows the configuration
instead of assuming 127.0.0.1:9464. Exit 0 healthy, 1 not (Docker's convention), 2 bad config."""

from __future__ import annotations

import argparse

HELP = "Probe /healthz of the metrics endpoint in the effective configuration (exit 0 healthy, 1 not)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (default: $STEPWATCH_CONFIG)")
    parser.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS", help="default 2")


def probe_url(endpoint: str, tls: bool) -> str:
    """The URL to probe for a bind address: a wildcard bind is probed on loopback."""
    from stepwatch.config import parse_endpoint

    host, port = parse_endpoint(endpoint)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}/healthz"


def run(args: argparse.Namespace) -> int:
    import ssl
    import sys
    import urllib.request
    from pathlib import Path

    from stepwatch.cli import UsageError
    from stepwatch.config import ConfigError, load_config

    try:
        config = load_config(Path(args.config) if args.config else None)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    prom = config.exporters.prometheus
    if not prom.enabled:
        print("unhealthy: exporters.prometheus is disabled, there is no /healthz to probe", file=sys.stderr)
        return 1
    tls = config.security.metrics_tls.enabled
    url = probe_url(prom.endpoint, tls)
    # our own process on loopback: liveness, not identity, so the certificate is not verified
    context = ssl._create_unverified_context() if tls else None
    try:
        with urllib.request.urlopen(url, timeout=args.timeout, context=context) as response:
            healthy = response.status == 200
    except OSError as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if healthy else 1
