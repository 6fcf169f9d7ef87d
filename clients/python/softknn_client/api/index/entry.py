from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.entry_response import EntryResponse
from ...models.error_response import ErrorResponse
from ...models.http_validation_error import HTTPValidationError
from ...types import Response


def _get_kwargs(
    chunk_id: str,
) -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/entries/{chunk_id}".format(
            chunk_id=quote(str(chunk_id), safe=""),
        ),
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EntryResponse | ErrorResponse | HTTPValidationError | None:
    if response.status_code == 200:
        response_200 = EntryResponse.from_dict(response.json())

        return response_200

    if response.status_code == 401:
        response_401 = ErrorResponse.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = ErrorResponse.from_dict(response.json())

        return response_404

    if response.status_code == 422:
        response_422 = HTTPValidationError.from_dict(response.json())

        return response_422

    if response.status_code == 503:
        response_503 = ErrorResponse.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[EntryResponse | ErrorResponse | HTTPValidationError]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
) -> Response[EntryResponse | ErrorResponse | HTTPValidationError]:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EntryResponse | ErrorResponse | HTTPValidationError]
    """

    kwargs = _get_kwargs(
        chunk_id=chunk_id,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
) -> EntryResponse | ErrorResponse | HTTPValidationError | None:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EntryResponse | ErrorResponse | HTTPValidationError
    """

    return sync_detailed(
        chunk_id=chunk_id,
        client=client,
    ).parsed


async def asyncio_detailed(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
) -> Response[EntryResponse | ErrorResponse | HTTPValidationError]:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EntryResponse | ErrorResponse | HTTPValidationError]
    """

    kwargs = _get_kwargs(
        chunk_id=chunk_id,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
) -> EntryResponse | ErrorResponse | HTTPValidationError | None:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EntryResponse | ErrorResponse | HTTPValidationError
    """

    return (
        await asyncio_detailed(
            chunk_id=chunk_id,
            client=client,
        )
    ).parsed
