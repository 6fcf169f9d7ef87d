from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.error_response import ErrorResponse
from ...models.rank import Rank
from ...models.rerank_request import RerankRequest
from ...types import Response


def _get_kwargs(
    *,
    body: RerankRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/rerank",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ErrorResponse | list[Rank] | None:
    if response.status_code == 200:
        response_200 = []
        _response_200 = response.json()
        for response_200_item_data in _response_200:
            response_200_item = Rank.from_dict(response_200_item_data)

            response_200.append(response_200_item)

        return response_200

    if response.status_code == 400:
        response_400 = ErrorResponse.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = ErrorResponse.from_dict(response.json())

        return response_401

    if response.status_code == 404:
        response_404 = ErrorResponse.from_dict(response.json())

        return response_404

    if response.status_code == 413:
        response_413 = ErrorResponse.from_dict(response.json())

        return response_413

    if response.status_code == 422:
        response_422 = ErrorResponse.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = ErrorResponse.from_dict(response.json())

        return response_429

    if response.status_code == 503:
        response_503 = ErrorResponse.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ErrorResponse | list[Rank]]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: RerankRequest,
) -> Response[ErrorResponse | list[Rank]]:
    """Rerank texts for a query by the retrieval's similarity (TEI's schema)

     One `{index, score}` per text (with `text` when return_text), by score high to low, ties
    by index; `top_n` keeps the best n. The bundle's retrieval decides the similarity: hybrid
    where it has a lexical index (λ as calibrated), else dense (`retrieval` overrides it).

    Args:
        body (RerankRequest): Score texts against a query with softknn's retrieval similarity
            (docs/design.md, "Rerank"); the similarity's parameters left unset (null) take the
            server's settings, else the bundle's own.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorResponse | list[Rank]]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    body: RerankRequest,
) -> ErrorResponse | list[Rank] | None:
    """Rerank texts for a query by the retrieval's similarity (TEI's schema)

     One `{index, score}` per text (with `text` when return_text), by score high to low, ties
    by index; `top_n` keeps the best n. The bundle's retrieval decides the similarity: hybrid
    where it has a lexical index (λ as calibrated), else dense (`retrieval` overrides it).

    Args:
        body (RerankRequest): Score texts against a query with softknn's retrieval similarity
            (docs/design.md, "Rerank"); the similarity's parameters left unset (null) take the
            server's settings, else the bundle's own.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorResponse | list[Rank]
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: RerankRequest,
) -> Response[ErrorResponse | list[Rank]]:
    """Rerank texts for a query by the retrieval's similarity (TEI's schema)

     One `{index, score}` per text (with `text` when return_text), by score high to low, ties
    by index; `top_n` keeps the best n. The bundle's retrieval decides the similarity: hybrid
    where it has a lexical index (λ as calibrated), else dense (`retrieval` overrides it).

    Args:
        body (RerankRequest): Score texts against a query with softknn's retrieval similarity
            (docs/design.md, "Rerank"); the similarity's parameters left unset (null) take the
            server's settings, else the bundle's own.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorResponse | list[Rank]]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: RerankRequest,
) -> ErrorResponse | list[Rank] | None:
    """Rerank texts for a query by the retrieval's similarity (TEI's schema)

     One `{index, score}` per text (with `text` when return_text), by score high to low, ties
    by index; `top_n` keeps the best n. The bundle's retrieval decides the similarity: hybrid
    where it has a lexical index (λ as calibrated), else dense (`retrieval` overrides it).

    Args:
        body (RerankRequest): Score texts against a query with softknn's retrieval similarity
            (docs/design.md, "Rerank"); the similarity's parameters left unset (null) take the
            server's settings, else the bundle's own.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorResponse | list[Rank]
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
