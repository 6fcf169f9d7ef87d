from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.error_response import ErrorResponse
from ...models.generate_request import GenerateRequest
from ...models.generate_response import GenerateResponse
from ...types import Response


def _get_kwargs(
    *,
    body: GenerateRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/generate",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ErrorResponse | GenerateResponse | None:
    if response.status_code == 200:
        response_200 = GenerateResponse.from_dict(response.json())

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

    if response.status_code == 409:
        response_409 = ErrorResponse.from_dict(response.json())

        return response_409

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
) -> Response[ErrorResponse | GenerateResponse]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: GenerateRequest,
) -> Response[ErrorResponse | GenerateResponse]:
    """Generate with the KB in the generator's attention, with evidence

     409 generator_unavailable when the bundle was built without a generator; 429 when
    `generator.max_concurrent` generations run and `generator.max_queue` wait.

    Args:
        body (GenerateRequest): Generation with the KB in the generator's attention: exactly one
            of `prompt` and `messages`; a generation parameter left unset takes the server's setting
            (SOFTKNN_GENERATE__*), else the bundle's own, else the default it names.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorResponse | GenerateResponse]
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
    body: GenerateRequest,
) -> ErrorResponse | GenerateResponse | None:
    """Generate with the KB in the generator's attention, with evidence

     409 generator_unavailable when the bundle was built without a generator; 429 when
    `generator.max_concurrent` generations run and `generator.max_queue` wait.

    Args:
        body (GenerateRequest): Generation with the KB in the generator's attention: exactly one
            of `prompt` and `messages`; a generation parameter left unset takes the server's setting
            (SOFTKNN_GENERATE__*), else the bundle's own, else the default it names.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorResponse | GenerateResponse
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: GenerateRequest,
) -> Response[ErrorResponse | GenerateResponse]:
    """Generate with the KB in the generator's attention, with evidence

     409 generator_unavailable when the bundle was built without a generator; 429 when
    `generator.max_concurrent` generations run and `generator.max_queue` wait.

    Args:
        body (GenerateRequest): Generation with the KB in the generator's attention: exactly one
            of `prompt` and `messages`; a generation parameter left unset takes the server's setting
            (SOFTKNN_GENERATE__*), else the bundle's own, else the default it names.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ErrorResponse | GenerateResponse]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: GenerateRequest,
) -> ErrorResponse | GenerateResponse | None:
    """Generate with the KB in the generator's attention, with evidence

     409 generator_unavailable when the bundle was built without a generator; 429 when
    `generator.max_concurrent` generations run and `generator.max_queue` wait.

    Args:
        body (GenerateRequest): Generation with the KB in the generator's attention: exactly one
            of `prompt` and `messages`; a generation parameter left unset takes the server's setting
            (SOFTKNN_GENERATE__*), else the bundle's own, else the default it names.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ErrorResponse | GenerateResponse
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
