"""django-auth-ldap's settings from SlotServe's (``SLOTSERVE_LDAP_*``), made only when LDAP is on."""

from __future__ import annotations

from typing import Any

from slotserve_base.env import env_bool, env_str


def ldap_settings(
    *,
    url: str,
    bind_dn: str,
    bind_password: str,
    start_tls: bool,
    user_base: str,
    user_filter: str,
    group_base: str,
    group_type: str,
    staff_group: str,
) -> dict[str, Any]:
    from django.core.exceptions import ImproperlyConfigured

    try:
        import ldap
        from django_auth_ldap.config import GroupOfNamesType, LDAPSearch, PosixGroupType
    except ImportError:
        raise ImproperlyConfigured(
            "SLOTSERVE_LDAP_URL is set but django-auth-ldap is not installed: pip install 'slotserve[ldap]' "
            "(Debian needs libldap2-dev and libsasl2-dev to build python-ldap)"
        ) from None
    if not user_base:
        raise ImproperlyConfigured("SLOTSERVE_LDAP_URL is set: say where users are, SLOTSERVE_LDAP_USER_BASE")
    found: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": url,
        "AUTH_LDAP_BIND_DN": bind_dn,
        "AUTH_LDAP_BIND_PASSWORD": bind_password,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(user_base, ldap.SCOPE_SUBTREE, user_filter),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: 5, ldap.OPT_TIMEOUT: 10},
    }
    if group_base:
        posix = group_type.lower() == "posixgroup"
        found.update(
            AUTH_LDAP_GROUP_SEARCH=LDAPSearch(
                group_base,
                ldap.SCOPE_SUBTREE,
                "(objectClass=posixGroup)" if posix else "(objectClass=groupOfNames)",
            ),
            AUTH_LDAP_GROUP_TYPE=PosixGroupType(name_attr="cn")
            if posix
            else GroupOfNamesType(name_attr="cn"),
            # The directory's groups are the user's SlotServe groups, as of each sign-in.
            AUTH_LDAP_MIRROR_GROUPS=True,
        )
        if staff_group:
            found["AUTH_LDAP_USER_FLAGS_BY_GROUP"] = {"is_staff": staff_group}
    return found


def require_oidc_endpoints(endpoints: dict[str, str]) -> None:
    """OpenID Connect sign-in is on: every endpoint must be named (by its setting)."""
    missing = [name for name, value in endpoints.items() if not value]
    if missing:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"SLOTSERVE_OIDC_CLIENT_ID is set, so OpenID Connect sign-in needs {', '.join(missing)} "
            "(the provider's discovery document, /.well-known/openid-configuration, lists them)"
        )


def ldap_settings_from_env(url: str) -> dict[str, Any]:
    """``ldap_settings`` from the ``SLOTSERVE_LDAP_*`` variables (docs/settings.md)."""
    return ldap_settings(
        url=url,
        bind_dn=env_str("SLOTSERVE_LDAP_BIND_DN", ""),
        bind_password=env_str("SLOTSERVE_LDAP_BIND_PASSWORD", ""),
        start_tls=env_bool("SLOTSERVE_LDAP_START_TLS", False),
        user_base=env_str("SLOTSERVE_LDAP_USER_BASE", ""),
        user_filter=env_str("SLOTSERVE_LDAP_USER_FILTER", "(uid=%(user)s)"),
        group_base=env_str("SLOTSERVE_LDAP_GROUP_BASE", ""),
        group_type=env_str("SLOTSERVE_LDAP_GROUP_TYPE", "groupOfNames"),
        staff_group=env_str("SLOTSERVE_LDAP_STAFF_GROUP", ""),
    )


def oidc_settings_from_env() -> dict[str, Any]:
    """mozilla-django-oidc's settings and SlotServe's own from the ``SLOTSERVE_OIDC_*``
    variables (docs/settings.md); with a client id, all four endpoints or start-up stops."""
    client_id = env_str("SLOTSERVE_OIDC_CLIENT_ID", "")
    endpoints = {
        "SLOTSERVE_OIDC_AUTHORIZATION_ENDPOINT": env_str("SLOTSERVE_OIDC_AUTHORIZATION_ENDPOINT", ""),
        "SLOTSERVE_OIDC_TOKEN_ENDPOINT": env_str("SLOTSERVE_OIDC_TOKEN_ENDPOINT", ""),
        "SLOTSERVE_OIDC_USERINFO_ENDPOINT": env_str("SLOTSERVE_OIDC_USERINFO_ENDPOINT", ""),
        "SLOTSERVE_OIDC_JWKS_ENDPOINT": env_str("SLOTSERVE_OIDC_JWKS_ENDPOINT", ""),
    }
    if client_id:
        require_oidc_endpoints(endpoints)
    return {
        "SLOTSERVE_OIDC_NAME": env_str("SLOTSERVE_OIDC_NAME", "single sign-on"),
        "SLOTSERVE_OIDC_GROUPS_CLAIM": env_str("SLOTSERVE_OIDC_GROUPS_CLAIM", "groups"),
        "SLOTSERVE_OIDC_STAFF_GROUP": env_str("SLOTSERVE_OIDC_STAFF_GROUP", ""),
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": env_str("SLOTSERVE_OIDC_CLIENT_SECRET", ""),
        "OIDC_OP_AUTHORIZATION_ENDPOINT": endpoints["SLOTSERVE_OIDC_AUTHORIZATION_ENDPOINT"],
        "OIDC_OP_TOKEN_ENDPOINT": endpoints["SLOTSERVE_OIDC_TOKEN_ENDPOINT"],
        "OIDC_OP_USER_ENDPOINT": endpoints["SLOTSERVE_OIDC_USERINFO_ENDPOINT"],
        "OIDC_OP_JWKS_ENDPOINT": endpoints["SLOTSERVE_OIDC_JWKS_ENDPOINT"],
        "OIDC_RP_SIGN_ALGO": env_str("SLOTSERVE_OIDC_SIGN_ALGO", "RS256"),
        "OIDC_RP_SCOPES": env_str("SLOTSERVE_OIDC_SCOPES", "openid email profile"),
    }
