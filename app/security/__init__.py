"""Security and hardening: TLS, authentication, tenants, input limits and privacy."""

from .auth import (
    AdminAuthenticator,
    AuthConfigError,
    BasicAuthenticator,
    BearerAuthenticator,
    BearerAuthInterceptor,
    admin_auth_middleware,
    bearer_auth_middleware,
    current_tenant,
)
from .config import (
    AdminAuthConfig,
    AuthConfig,
    LimitsConfig,
    PrivacyConfig,
    SecurityConfig,
    TenancyConfig,
    TLSClientConfig,
    TLSServerConfig,
)
from .limits import LimitCounters, LimitExceeded, PrometheusLimitMeter, apply_span_limits, scoring_guard
from .redaction import Redactor, SecretsLogFilter
from .tenants import DEFAULT_TENANT, PerTenant, Tenant, TenantPolicy
from .tls import (
    ReloadingSSLContext,
    TLSConfigError,
    aiokafka_ssl_kwargs,
    client_ssl_context,
    grpc_server_credentials,
    otlp_grpc_channel_credentials,
    otlp_http_exporter_tls_kwargs,
    server_ssl_context,
)

__all__ = [
    "DEFAULT_TENANT",
    "AdminAuthConfig",
    "AdminAuthenticator",
    "AuthConfig",
    "AuthConfigError",
    "BasicAuthenticator",
    "BearerAuthInterceptor",
    "BearerAuthenticator",
    "LimitCounters",
    "LimitExceeded",
    "LimitsConfig",
    "PerTenant",
    "PrivacyConfig",
    "PrometheusLimitMeter",
    "Redactor",
    "ReloadingSSLContext",
    "SecretsLogFilter",
    "SecurityConfig",
    "TLSClientConfig",
    "TLSConfigError",
    "TLSServerConfig",
    "TenancyConfig",
    "Tenant",
    "TenantPolicy",
    "admin_auth_middleware",
    "aiokafka_ssl_kwargs",
    "apply_span_limits",
    "bearer_auth_middleware",
    "client_ssl_context",
    "current_tenant",
    "grpc_server_credentials",
    "otlp_grpc_channel_credentials",
    "otlp_http_exporter_tls_kwargs",
    "scoring_guard",
    "server_ssl_context",
]
