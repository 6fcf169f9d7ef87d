"""Bearer auth: an optional API key for /v1/*, an admin token for /v1/admin/*.

Comparison is constant-time (hmac.compare_digest); keys are SecretStr in Settings and are never
logged. /healthz, /readyz and /metrics take no key.
    api_key unset      /v1/* open
    api_key set        /v1/* needs it (or the admin token): missing/wrong → 401
    admin_token unset  /v1/admin/* off → 403
    admin_token set    /v1/admin/* needs it: missing/wrong → 401; the API key → 403
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from softknn.service.deps import SettingsDep
from softknn.service.errors import Forbidden, Unauthorized

# auto_error=False: this module answers in the service's own error shape; HTTPBearer only parses
# the header and documents the scheme in OpenAPI (the /docs "Authorize" button).
_bearer = HTTPBearer(auto_error=False, description="API key or admin token")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _matches(token: str, secret: SecretStr | None) -> bool:
    return secret is not None and hmac.compare_digest(token.encode(), secret.get_secret_value().encode())


def _token(creds: HTTPAuthorizationCredentials | None, what: str) -> str:
    if creds is None or not creds.credentials:
        raise Unauthorized(f"missing bearer token: send 'Authorization: Bearer <{what}>'", headers=_CHALLENGE)
    return creds.credentials


async def require_api_key(settings: SettingsDep, creds: BearerDep) -> None:
    auth = settings.auth
    if auth.api_key is None:
        return
    token = _token(creds, "api key")
    if not (_matches(token, auth.api_key) or _matches(token, auth.admin_token)):
        raise Unauthorized("invalid API key", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


async def require_admin(settings: SettingsDep, creds: BearerDep) -> None:
    auth = settings.auth
    if auth.admin_token is None:
        raise Forbidden("admin routes are disabled: no admin token is configured (SOFTKNN_AUTH__ADMIN_TOKEN)")
    token = _token(creds, "admin token")
    if _matches(token, auth.admin_token):
        return
    if _matches(token, auth.api_key):
        raise Forbidden("the API key does not grant admin routes; use the admin token")
    raise Unauthorized("invalid admin token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
