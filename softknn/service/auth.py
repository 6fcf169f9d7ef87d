"""Bearer auth: who a request is (a Principal: the KBs it may see, whether it may write).

Comparison is constant-time (hmac.compare_digest, every configured key compared); keys are
SecretStr in Settings and are never logged. /healthz, /readyz and /metrics take no key.
    api_key            every KB, read
    keys[i]            its `kbs` (["*"] = every KB), its `scopes` (read, or read and write)
    admin_token        every KB, read and write, and /v1/admin/*
    reads              open when no api_key and no keys are set; else a key: missing/wrong → 401
    writes             (PUT/DELETE /v1/documents) the admin token or a write-scoped key: missing/wrong
                       → 401; a read key → 403 (after the KB check: softknn.service.kbs); none
                       configured → 403
    /v1/admin/*        the admin token: missing/wrong → 401; any other key → 403; unset → 403
A KB a key does not cover answers 404 exactly as a KB that does not exist (softknn.service.kbs.KBs.pick).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from softknn.params import Auth
from softknn.service.deps import SettingsDep
from softknn.service.errors import Forbidden, Unauthorized
from softknn.service.kbs import Principal

# auto_error=False: this module answers in the service's own error shape; HTTPBearer only parses
# the header and documents the scheme in OpenAPI (the /docs "Authorize" button).
_bearer = HTTPBearer(auto_error=False, description="API key, scoped key or admin token")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _matches(token: str, secret: SecretStr | None) -> bool:
    return secret is not None and hmac.compare_digest(token.encode(), secret.get_secret_value().encode())


def _token(creds: HTTPAuthorizationCredentials | None, what: str) -> str:
    if creds is None or not creds.credentials:
        raise Unauthorized(f"missing bearer token: send 'Authorization: Bearer <{what}>'", headers=_CHALLENGE)
    return creds.credentials


ADMIN = Principal(None, write=True, who="the admin token")
OPEN_READS = Principal(None, write=False, who="an unauthenticated request")


def principal(auth: Auth, token: str) -> Principal | None:
    """Who `token` is, or None for no configured key. Every key is compared (no early exit)."""
    admin, api = _matches(token, auth.admin_token), _matches(token, auth.api_key)
    scoped = [k for k in auth.keys if _matches(token, k.key)]
    if admin:
        return ADMIN
    if api:
        return Principal(None, write=False, who="the API key")
    if scoped:
        k = scoped[0]
        return Principal(None if "*" in k.kbs else frozenset(k.kbs), write="write" in k.scopes)
    return None


def _invalid(what: str) -> Unauthorized:
    return Unauthorized(f"invalid {what}", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


async def require_api_key(settings: SettingsDep, creds: BearerDep) -> Principal:
    """Read routes: open without keys; else any configured key."""
    auth = settings.auth
    if auth.reads_open:
        if creds is not None and creds.credentials and _matches(creds.credentials, auth.admin_token):
            return ADMIN
        return OPEN_READS
    found = principal(auth, _token(creds, "api key"))
    if found is None:
        raise _invalid("API key")
    return found


def writes_configured(auth: Auth) -> bool:
    return auth.admin_token is not None or any("write" in k.scopes for k in auth.keys)


async def require_writer(settings: SettingsDep, creds: BearerDep) -> Principal:
    """KB write routes: a configured key (its write scope is checked with its KB, KBs.pick)."""
    auth = settings.auth
    if not writes_configured(auth):
        raise Forbidden("admin routes are disabled: no admin token is configured (SOFTKNN_AUTH__ADMIN_TOKEN)")
    found = principal(auth, _token(creds, "admin token"))
    if found is None:
        raise _invalid("admin token")
    return found


async def require_admin(settings: SettingsDep, creds: BearerDep) -> Principal:
    auth = settings.auth
    if auth.admin_token is None:
        raise Forbidden("admin routes are disabled: no admin token is configured (SOFTKNN_AUTH__ADMIN_TOKEN)")
    found = principal(auth, _token(creds, "admin token"))
    if found is ADMIN:
        return found
    if found is not None:  # the API key or a scoped key
        raise Forbidden(f"{found.who} does not grant admin routes; use the admin token")
    raise _invalid("admin token")


ReaderDep = Annotated[Principal, Depends(require_api_key)]
WriterDep = Annotated[Principal, Depends(require_writer)]
AdminDep = Annotated[Principal, Depends(require_admin)]
