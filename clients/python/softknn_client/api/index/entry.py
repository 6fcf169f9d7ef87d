from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.entry_response import EntryResponse
from ...models.error_response import ErrorResponse
from ...types import UNSET, Response, Unset


def _get_kwargs(
    chunk_id: str,
    *,
    kb: None | str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    json_kb: None | str | Unset
    if isinstance(kb, Unset):
        json_kb = UNSET
    else:
        json_kb = kb
    params["kb"] = json_kb

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/entries/{chunk_id}".format(
            chunk_id=quote(str(chunk_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> EntryResponse | ErrorResponse | None:
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
        response_422 = ErrorResponse.from_dict(response.json())

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
) -> Response[EntryResponse | ErrorResponse]:
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
    kb: None | str | Unset = UNSET,
) -> Response[EntryResponse | ErrorResponse]:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EntryResponse | ErrorResponse]
    """

    kwargs = _get_kwargs(
        chunk_id=chunk_id,
        kb=kb,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> EntryResponse | ErrorResponse | None:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EntryResponse | ErrorResponse
    """

    return sync_detailed(
        chunk_id=chunk_id,
        client=client,
        kb=kb,
    ).parsed


async def asyncio_detailed(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> Response[EntryResponse | ErrorResponse]:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[EntryResponse | ErrorResponse]
    """

    kwargs = _get_kwargs(
        chunk_id=chunk_id,
        kb=kb,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    chunk_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> EntryResponse | ErrorResponse | None:
    """One KB chunk with its provenance

    Args:
        chunk_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        EntryResponse | ErrorResponse
    """

    return (
        await asyncio_detailed(
            chunk_id=chunk_id,
            client=client,
            kb=kb,
        )
    ).parsed
