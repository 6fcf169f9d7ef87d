from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.chat_completion import ChatCompletion
from ...models.chat_completion_request import ChatCompletionRequest
from ...models.error_response import ErrorResponse
from ...types import Response


def _get_kwargs(
    *,
    body: ChatCompletionRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/chat/completions",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ChatCompletion | ErrorResponse | None:
    if response.status_code == 200:
        response_200 = ChatCompletion.from_dict(response.json())

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
) -> Response[ChatCompletion | ErrorResponse]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
) -> Response[ChatCompletion | ErrorResponse]:
    """OpenAI-compatible chat completion with the KB in the generator's attention

     `model` must be the served generator's id (or empty): else 404 model_not_found. n = 1 only.
    temperature defaults to 0 (greedy), not OpenAI's 1.

    Args:
        body (ChatCompletionRequest): OpenAI-compatible chat completion with the KB in the
            generator's attention; softknn's generation parameters are extra top-level fields (the
            openai client's `extra_body`), unset as /v1/generate's.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ChatCompletion | ErrorResponse]
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
    body: ChatCompletionRequest,
) -> ChatCompletion | ErrorResponse | None:
    """OpenAI-compatible chat completion with the KB in the generator's attention

     `model` must be the served generator's id (or empty): else 404 model_not_found. n = 1 only.
    temperature defaults to 0 (greedy), not OpenAI's 1.

    Args:
        body (ChatCompletionRequest): OpenAI-compatible chat completion with the KB in the
            generator's attention; softknn's generation parameters are extra top-level fields (the
            openai client's `extra_body`), unset as /v1/generate's.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ChatCompletion | ErrorResponse
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
) -> Response[ChatCompletion | ErrorResponse]:
    """OpenAI-compatible chat completion with the KB in the generator's attention

     `model` must be the served generator's id (or empty): else 404 model_not_found. n = 1 only.
    temperature defaults to 0 (greedy), not OpenAI's 1.

    Args:
        body (ChatCompletionRequest): OpenAI-compatible chat completion with the KB in the
            generator's attention; softknn's generation parameters are extra top-level fields (the
            openai client's `extra_body`), unset as /v1/generate's.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ChatCompletion | ErrorResponse]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: ChatCompletionRequest,
) -> ChatCompletion | ErrorResponse | None:
    """OpenAI-compatible chat completion with the KB in the generator's attention

     `model` must be the served generator's id (or empty): else 404 model_not_found. n = 1 only.
    temperature defaults to 0 (greedy), not OpenAI's 1.

    Args:
        body (ChatCompletionRequest): OpenAI-compatible chat completion with the KB in the
            generator's attention; softknn's generation parameters are extra top-level fields (the
            openai client's `extra_body`), unset as /v1/generate's.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ChatCompletion | ErrorResponse
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
