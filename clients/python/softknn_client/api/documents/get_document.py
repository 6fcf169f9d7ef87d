from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.document_response import DocumentResponse
from ...models.error_response import ErrorResponse
from ...types import UNSET, Response, Unset


def _get_kwargs(
    doc_id: str,
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
        "url": "/v1/documents/{doc_id}".format(
            doc_id=quote(str(doc_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> DocumentResponse | ErrorResponse | None:
    if response.status_code == 200:
        response_200 = DocumentResponse.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = ErrorResponse.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = ErrorResponse.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = ErrorResponse.from_dict(response.json())

        return response_403

    if response.status_code == 404:
        response_404 = ErrorResponse.from_dict(response.json())

        return response_404

    if response.status_code == 409:
        response_409 = ErrorResponse.from_dict(response.json())

        return response_409

    if response.status_code == 413:
        response_413 = ErrorResponse.from_dict(response.json())

        return response_413

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
) -> Response[DocumentResponse | ErrorResponse]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    doc_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> Response[DocumentResponse | ErrorResponse]:
    """One KB document and its chunks

    Args:
        doc_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[DocumentResponse | ErrorResponse]
    """

    kwargs = _get_kwargs(
        doc_id=doc_id,
        kb=kb,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    doc_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> DocumentResponse | ErrorResponse | None:
    """One KB document and its chunks

    Args:
        doc_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        DocumentResponse | ErrorResponse
    """

    return sync_detailed(
        doc_id=doc_id,
        client=client,
        kb=kb,
    ).parsed


async def asyncio_detailed(
    doc_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> Response[DocumentResponse | ErrorResponse]:
    """One KB document and its chunks

    Args:
        doc_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[DocumentResponse | ErrorResponse]
    """

    kwargs = _get_kwargs(
        doc_id=doc_id,
        kb=kb,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    doc_id: str,
    *,
    client: AuthenticatedClient,
    kb: None | str | Unset = UNSET,
) -> DocumentResponse | ErrorResponse | None:
    """One KB document and its chunks

    Args:
        doc_id (str):
        kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use,
            else the one named `default` (a name this key may not use answers 404 as one that does not
            exist)

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        DocumentResponse | ErrorResponse
    """

    return (
        await asyncio_detailed(
            doc_id=doc_id,
            client=client,
            kb=kb,
        )
    ).parsed
