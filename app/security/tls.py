"""TLS builders: server credentials for gRPC and aiohttp that reload rotated certificates, and
client settings for Kafka and the OTLP exporters.

Reloading follows the collector's configtls `reload_interval` idea without a timer: files are
stat()ed when a new connection arrives and re-read only if their (mtime, size, inode) changed. A
half-written rotation (certificate and key that do not match) is refused and the previous pair
keeps serving.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .config import TLSClientConfig, TLSServerConfig

logger = logging.getLogger(__name__)

_TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TLSConfigError(ValueError):
    """The TLS files cannot be used (missing, unreadable, key does not match certificate)."""


_Stamp = tuple[int, int, int]


def _stamp(path: Path) -> _Stamp:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@dataclass(frozen=True, slots=True)
class CertificateMaterial:
    """One consistent snapshot of the PEM files, checked to be usable together."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None
    stamps: tuple[_Stamp, ...]


class CertificateFiles:
    """Watches a server's certificate, key and client CA files and loads consistent snapshots."""

    def __init__(self, cfg: TLSServerConfig) -> None:
        if cfg.cert_file is None or cfg.key_file is None:
            raise TLSConfigError("tls: cert_file and key_file are required for a TLS server")
        self.cfg = cfg
        self._paths: tuple[Path, ...] = tuple(
            p for p in (cfg.cert_file, cfg.key_file, cfg.client_ca_file) if p is not None
        )
        self._lock = threading.Lock()
        self.current = self._load()

    def _stamps(self) -> tuple[_Stamp, ...]:
        return tuple(_stamp(p) for p in self._paths)

    def _load(self) -> CertificateMaterial:
        cfg = self.cfg
        assert cfg.cert_file is not None and cfg.key_file is not None
        try:
            stamps = self._stamps()
            # load_cert_chain verifies that the key matches the certificate before we use them.
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            probe.load_cert_chain(cfg.cert_file, cfg.key_file)
            if cfg.client_ca_file is not None:
                probe.load_verify_locations(cafile=cfg.client_ca_file)
            material = CertificateMaterial(
                cert_chain=cfg.cert_file.read_bytes(),
                private_key=cfg.key_file.read_bytes(),
                client_ca=cfg.client_ca_file.read_bytes() if cfg.client_ca_file else None,
                stamps=stamps,
            )
        except (OSError, ssl.SSLError) as exc:
            # The message names the files and the OpenSSL reason, never their contents.
            raise TLSConfigError(f"tls: cannot load {', '.join(map(str, self._paths))}: {exc}") from exc
        if self._stamps() != stamps:
            raise TLSConfigError("tls: certificate files changed while being read")
        return material

    def refresh(self) -> CertificateMaterial | None:
        """The new snapshot if the files changed and load cleanly; None if unchanged or unusable."""
        with self._lock:
            try:
                if self._stamps() == self.current.stamps:
                    return None
                material = self._load()
            except (OSError, TLSConfigError) as exc:
                logger.warning("TLS certificate reload failed, keeping the previous certificate: %s", exc)
                return None
            self.current = material
            logger.info("TLS certificate reloaded from %s", self.cfg.cert_file)
            return material


# -- gRPC ---------------------------------------------------------------------------------------


def grpc_server_credentials(cfg: TLSServerConfig) -> grpc.ServerCredentials:
    """Server credentials for `server.add_secure_port`, re-reading rotated files per new connection.

    grpcio exposes no minimum-TLS-version knob; its floor is TLS 1.2 (BoringSSL), which is the
    default here. A 1.3 minimum is refused rather than silently not enforced.
    """
    if cfg.min_version != "1.2":
        raise TLSConfigError(
            "tls: min_version 1.3 cannot be enforced on the gRPC receiver (grpcio has no such option; "
            "it accepts TLS 1.2 and 1.3); use 1.2 there"
        )
    files = CertificateFiles(cfg)

    def to_grpc(material: CertificateMaterial) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.private_key, material.cert_chain)], root_certificates=material.client_ca
        )

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        material = files.refresh()
        return None if material is None else to_grpc(material)

    return grpc.dynamic_ssl_server_credentials(
        to_grpc(files.current), fetch, require_client_authentication=cfg.client_ca_file is not None
    )


# -- ssl / aiohttp ------------------------------------------------------------------------------


class ReloadingSSLContext:
    """An `ssl.SSLContext` for asyncio/aiohttp servers whose certificates follow the files.

    `context` is the object to hand to the server. Its SNI callback (called for every client hello,
    with or without SNI) swaps the handshake onto the newest context when the files changed.
    """

    def __init__(self, cfg: TLSServerConfig) -> None:
        self.cfg = cfg
        self._files = CertificateFiles(cfg)
        self._active = self._build()
        self.context = self._build()
        self.context.sni_callback = self._on_hello

    def _build(self) -> ssl.SSLContext:
        cfg = self.cfg
        assert cfg.cert_file is not None and cfg.key_file is not None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[cfg.min_version]
        ctx.options |= ssl.OP_NO_COMPRESSION
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
            if cfg.client_ca_file is not None:
                ctx.load_verify_locations(cafile=cfg.client_ca_file)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"tls: cannot load {cfg.cert_file}: {exc}") from exc
        return ctx

    def reload_if_changed(self) -> bool:
        """Rebuild the active context if the files changed; True when it did."""
        if self._files.refresh() is None:
            return False
        try:
            self._active = self._build()
        except TLSConfigError as exc:
            logger.warning("TLS context rebuild failed, keeping the previous one: %s", exc)
            return False
        return True

    def _on_hello(self, conn: Any, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        try:
            self.reload_if_changed()
            conn.context = self._active
        except Exception:  # a failing callback must not kill the handshake path for everyone
            logger.exception("TLS certificate selection failed")


def server_ssl_context(cfg: TLSServerConfig) -> ReloadingSSLContext:
    """The reloading server context for aiohttp (`web.TCPSite(..., ssl_context=r.context)`)."""
    return ReloadingSSLContext(cfg)


# -- clients: Kafka, OTLP exporters -------------------------------------------------------------


def client_ssl_context(cfg: TLSClientConfig) -> ssl.SSLContext:
    """An `ssl.SSLContext` for aiokafka (`security_protocol="SSL", ssl_context=...`) and aiohttp clients."""
    try:
        ctx = ssl.create_default_context(cafile=str(cfg.ca_file) if cfg.ca_file else None)
        ctx.minimum_version = _TLS_VERSIONS[cfg.min_version]
        if cfg.cert_file is not None and cfg.key_file is not None:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"tls: cannot load client TLS files: {exc}") from exc
    return ctx


def otlp_grpc_channel_credentials(cfg: TLSClientConfig) -> grpc.ChannelCredentials:
    """`credentials=` for the OTLP gRPC exporters (spans or metrics)."""

    def read(path: Path | None) -> bytes | None:
        try:
            return path.read_bytes() if path is not None else None
        except OSError as exc:
            raise TLSConfigError(f"tls: cannot read {path}: {exc}") from exc

    return grpc.ssl_channel_credentials(
        root_certificates=read(cfg.ca_file),
        private_key=read(cfg.key_file),
        certificate_chain=read(cfg.cert_file),
    )


def otlp_http_exporter_tls_kwargs(cfg: TLSClientConfig) -> dict[str, str]:
    """`certificate_file` / `client_key_file` / `client_certificate_file` for the OTLP HTTP exporters."""
    kwargs: dict[str, str] = {}
    if cfg.ca_file is not None:
        kwargs["certificate_file"] = str(cfg.ca_file)
    if cfg.cert_file is not None and cfg.key_file is not None:
        kwargs["client_certificate_file"] = str(cfg.cert_file)
        kwargs["client_key_file"] = str(cfg.key_file)
    return kwargs


def aiokafka_ssl_kwargs(cfg: TLSClientConfig) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaProducer/Consumer: SSL with our context, or nothing."""
    if not cfg.enabled:
        return {}
    return {"security_protocol": "SSL", "ssl_context": client_ssl_context(cfg)}
