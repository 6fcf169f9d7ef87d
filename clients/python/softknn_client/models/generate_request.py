from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from attrs import define as _attrs_define

from ..models.generate_request_context import GenerateRequestContext, check_generate_request_context
from ..models.generate_request_mixing import GenerateRequestMixing, check_generate_request_mixing
from ..models.generate_request_positions import GenerateRequestPositions, check_generate_request_positions
from ..models.generate_request_retrieval_type_0 import (
    GenerateRequestRetrievalType0,
    check_generate_request_retrieval_type_0,
)
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.chat_message import ChatMessage
    from ..models.filter_and import FilterAnd
    from ..models.filter_match import FilterMatch
    from ..models.filter_not import FilterNot
    from ..models.filter_or import FilterOr


T = TypeVar("T", bound="GenerateRequest")


@_attrs_define
class GenerateRequest:
    """Generation with the KB in the generator's attention: exactly one of `prompt` and `messages`; a generation parameter
    left unset takes the server's setting (SOFTKNN_GENERATE__*), else the bundle's own, else the default it names.

        Attributes:
            alpha (float | Unset): fixed mixing: weight of the input's own attention, out = α·attn_intra + (1−α)·attn_db
                (seed 000 §4.3); ignored by joint mixing; left out: the server's setting, 0.7 by default
            context (GenerateRequestContext | Unset): memory: the KB in attention; prompt: the same chunks' text in the
                prompt (the RAG baseline); left out: the server's setting, memory by default
            evidence (int | Unset): evidence items returned per input; left out: the server's setting, 5 by default; at most
                the server's limits.max_evidence (50 by default)
            exact (bool | Unset): exact search, and the chunks' keys/values recomputed in float32 after this prompt's own
                prefix (the masked-concatenation contract)
            filter_ (FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset): R is drawn from the chunks that pass
                this filter only: {field, eq|in|gt|gte|lt|lte} on doc_id, chunk_id, label or metadata.NAME, combined with {and:
                [...]}, {or: [...]}, {not: ...}; ≤ 8 levels, ≤ 64 objects, ≤ 10000 `in` values; null = every chunk
            ignore_eos (bool | Unset): true: decode max_tokens tokens, past the model's end of answer (vLLM's and llama-
                server's ignore_eos; for benchmarks)
            k (int | None | Unset): KB chunks retrieved and placed in the generator's attention; null = the bundle's own
                (chosen at build time from its pseudo-questions: GET /v1/index generator.calibration), else 4; at most the
                server's limits.max_k (256 by default)
            kb (None | str | Unset): the KB to use, by name; empty = the only KB this key may use, else the one named
                `default` (a name this key may not use answers 404 as one that does not exist)
            knn_temperature (float | None | Unset): k-NN bandwidth τ: w_db = softmax(s/τ) for the softmax kernel (h² = τ for
                the others); null = the bundle's calibrated τ, else the retrieval's own default (docs/quality.md)
            lexical_weight (float | None | Unset): λ of the hybrid similarity (1−λ)·dense + λ·BM25; null = the λ the
                bundle's build chose (labelled KBs by leave-one-out, unlabelled by pseudo-queries), else 0.6
            max_tokens (int | Unset): tokens generated at most; left out: the server's setting, 64 by default; at most the
                server's generator.max_tokens (512 by default)
            messages (list[ChatMessage] | None | Unset): a chat, through the generator's chat template; the KB at the head
                of the last user message
            mixing (GenerateRequestMixing | Unset): fixed: the α rule; joint: one softmax over input and retrieved tokens
                (memory share is reported); left out: the server's setting, joint by default
            positions (GenerateRequestPositions | Unset): rotary placement of the chunks: side by side (composite) or one
                after another; left out: the server's setting, composite by default
            prior (float | None | Unset): joint mixing only: β of the k-NN prior, each chunk's share of the one softmax
                times (k·w_db(c))^β; 0 = the plain joint softmax; null = the bundle's own (as k), else 4
            prompt (None | str | Unset): a question: one user turn through the generator's chat template, as `messages` with
                one user message would be (raw: text the model continues, tokenised as it is, the KB before it); ≤
                limits.max_chars (20000 by default) characters
            raw (bool | Unset): true: `prompt` is raw text to continue (no chat template) Default: False.
            refuse (bool | Unset): true: a question whose nearest KB chunk is less similar than the bundle's refusal
                threshold (GET /v1/index generator.calibration.refusal) gets the refusal text and grounded false, nothing
                decoded; false: answered anyway (grounded still reported); left out: the server's setting, True by default
            retrieval (GenerateRequestRetrievalType0 | None | Unset): similarity s_c of the external k-NN: dense e_q·e_c,
                lexical BM25, or hybrid (1−λ)·dense + λ·BM25, each min-max normalised over its top candidates; null = hybrid
                where the bundle has a lexical index, else dense
            seed (int | None | Unset): seed of the sampler (temperature > 0): the same seed, the same answer
            spans (int | Unset): highlighted word spans per evidence item; left out: the server's setting, 5 by default
            stop (list[str] | None | Unset): a string or up to 16 strings; the answer ends before the first
            stream (bool | Unset): server-sent events, one per token, instead of one JSON answer Default: False.
            temperature (float | Unset): sampling temperature; 0 = greedy (the default here, unlike OpenAI's 1); left out:
                the server's setting, 0.0 by default
            top_p (float | Unset): nucleus sampling: the smallest set of tokens whose probability reaches top_p; left out:
                the server's setting, 1.0 by default
            use_kb (bool | Unset): false: the plain model, no retrieval
    """

    alpha: float | Unset = UNSET
    context: GenerateRequestContext | Unset = UNSET
    evidence: int | Unset = UNSET
    exact: bool | Unset = UNSET
    filter_: FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset = UNSET
    ignore_eos: bool | Unset = UNSET
    k: int | None | Unset = UNSET
    kb: None | str | Unset = UNSET
    knn_temperature: float | None | Unset = UNSET
    lexical_weight: float | None | Unset = UNSET
    max_tokens: int | Unset = UNSET
    messages: list[ChatMessage] | None | Unset = UNSET
    mixing: GenerateRequestMixing | Unset = UNSET
    positions: GenerateRequestPositions | Unset = UNSET
    prior: float | None | Unset = UNSET
    prompt: None | str | Unset = UNSET
    raw: bool | Unset = False
    refuse: bool | Unset = UNSET
    retrieval: GenerateRequestRetrievalType0 | None | Unset = UNSET
    seed: int | None | Unset = UNSET
    spans: int | Unset = UNSET
    stop: list[str] | None | Unset = UNSET
    stream: bool | Unset = False
    temperature: float | Unset = UNSET
    top_p: float | Unset = UNSET
    use_kb: bool | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_not import FilterNot  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        alpha = self.alpha

        context: str | Unset = UNSET
        if not isinstance(self.context, Unset):
            context = self.context

        evidence = self.evidence

        exact = self.exact

        filter_: dict[str, Any] | None | Unset
        if isinstance(self.filter_, Unset):
            filter_ = UNSET
        elif isinstance(self.filter_, FilterMatch):
            filter_ = self.filter_.to_dict()
        elif isinstance(self.filter_, FilterAnd):
            filter_ = self.filter_.to_dict()
        elif isinstance(self.filter_, FilterOr):
            filter_ = self.filter_.to_dict()
        elif isinstance(self.filter_, FilterNot):
            filter_ = self.filter_.to_dict()
        else:
            filter_ = self.filter_

        ignore_eos = self.ignore_eos

        k: int | None | Unset
        if isinstance(self.k, Unset):
            k = UNSET
        else:
            k = self.k

        kb: None | str | Unset
        if isinstance(self.kb, Unset):
            kb = UNSET
        else:
            kb = self.kb

        knn_temperature: float | None | Unset
        if isinstance(self.knn_temperature, Unset):
            knn_temperature = UNSET
        else:
            knn_temperature = self.knn_temperature

        lexical_weight: float | None | Unset
        if isinstance(self.lexical_weight, Unset):
            lexical_weight = UNSET
        else:
            lexical_weight = self.lexical_weight

        max_tokens = self.max_tokens

        messages: list[dict[str, Any]] | None | Unset
        if isinstance(self.messages, Unset):
            messages = UNSET
        elif isinstance(self.messages, list):
            messages = []
            for messages_type_0_item_data in self.messages:
                messages_type_0_item = messages_type_0_item_data.to_dict()
                messages.append(messages_type_0_item)

        else:
            messages = self.messages

        mixing: str | Unset = UNSET
        if not isinstance(self.mixing, Unset):
            mixing = self.mixing

        positions: str | Unset = UNSET
        if not isinstance(self.positions, Unset):
            positions = self.positions

        prior: float | None | Unset
        if isinstance(self.prior, Unset):
            prior = UNSET
        else:
            prior = self.prior

        prompt: None | str | Unset
        if isinstance(self.prompt, Unset):
            prompt = UNSET
        else:
            prompt = self.prompt

        raw = self.raw

        refuse = self.refuse

        retrieval: None | str | Unset
        if isinstance(self.retrieval, Unset):
            retrieval = UNSET
        elif isinstance(self.retrieval, str):
            retrieval = self.retrieval
        else:
            retrieval = self.retrieval

        seed: int | None | Unset
        if isinstance(self.seed, Unset):
            seed = UNSET
        else:
            seed = self.seed

        spans = self.spans

        stop: list[str] | None | Unset
        if isinstance(self.stop, Unset):
            stop = UNSET
        elif isinstance(self.stop, list):
            stop = self.stop

        else:
            stop = self.stop

        stream = self.stream

        temperature = self.temperature

        top_p = self.top_p

        use_kb = self.use_kb

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if alpha is not UNSET:
            field_dict["alpha"] = alpha
        if context is not UNSET:
            field_dict["context"] = context
        if evidence is not UNSET:
            field_dict["evidence"] = evidence
        if exact is not UNSET:
            field_dict["exact"] = exact
        if filter_ is not UNSET:
            field_dict["filter"] = filter_
        if ignore_eos is not UNSET:
            field_dict["ignore_eos"] = ignore_eos
        if k is not UNSET:
            field_dict["k"] = k
        if kb is not UNSET:
            field_dict["kb"] = kb
        if knn_temperature is not UNSET:
            field_dict["knn_temperature"] = knn_temperature
        if lexical_weight is not UNSET:
            field_dict["lexical_weight"] = lexical_weight
        if max_tokens is not UNSET:
            field_dict["max_tokens"] = max_tokens
        if messages is not UNSET:
            field_dict["messages"] = messages
        if mixing is not UNSET:
            field_dict["mixing"] = mixing
        if positions is not UNSET:
            field_dict["positions"] = positions
        if prior is not UNSET:
            field_dict["prior"] = prior
        if prompt is not UNSET:
            field_dict["prompt"] = prompt
        if raw is not UNSET:
            field_dict["raw"] = raw
        if refuse is not UNSET:
            field_dict["refuse"] = refuse
        if retrieval is not UNSET:
            field_dict["retrieval"] = retrieval
        if seed is not UNSET:
            field_dict["seed"] = seed
        if spans is not UNSET:
            field_dict["spans"] = spans
        if stop is not UNSET:
            field_dict["stop"] = stop
        if stream is not UNSET:
            field_dict["stream"] = stream
        if temperature is not UNSET:
            field_dict["temperature"] = temperature
        if top_p is not UNSET:
            field_dict["top_p"] = top_p
        if use_kb is not UNSET:
            field_dict["use_kb"] = use_kb

        return field_dict

    @classmethod
    def from_dict(cls: type[T], src_dict: Mapping[str, Any]) -> T:
        from ..models.chat_message import ChatMessage  # noqa: PLC0415
        from ..models.filter_and import FilterAnd  # noqa: PLC0415
        from ..models.filter_match import FilterMatch  # noqa: PLC0415
        from ..models.filter_not import FilterNot  # noqa: PLC0415
        from ..models.filter_or import FilterOr  # noqa: PLC0415

        d = dict(src_dict)
        alpha = d.pop("alpha", UNSET)

        _context = d.pop("context", UNSET)
        context: GenerateRequestContext | Unset
        if isinstance(_context, Unset):
            context = UNSET
        else:
            context = check_generate_request_context(_context)

        evidence = d.pop("evidence", UNSET)

        exact = d.pop("exact", UNSET)

        def _parse_filter_(data: object) -> FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_0 = FilterMatch.from_dict(data)

                return filter_type_0_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_1 = FilterAnd.from_dict(data)

                return filter_type_0_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_2 = FilterOr.from_dict(data)

                return filter_type_0_type_2
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                filter_type_0_type_3 = FilterNot.from_dict(data)

                return filter_type_0_type_3
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(FilterAnd | FilterMatch | FilterNot | FilterOr | None | Unset, data)

        filter_ = _parse_filter_(d.pop("filter", UNSET))

        ignore_eos = d.pop("ignore_eos", UNSET)

        def _parse_k(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        k = _parse_k(d.pop("k", UNSET))

        def _parse_kb(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        kb = _parse_kb(d.pop("kb", UNSET))

        def _parse_knn_temperature(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        knn_temperature = _parse_knn_temperature(d.pop("knn_temperature", UNSET))

        def _parse_lexical_weight(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        lexical_weight = _parse_lexical_weight(d.pop("lexical_weight", UNSET))

        max_tokens = d.pop("max_tokens", UNSET)

        def _parse_messages(data: object) -> list[ChatMessage] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                messages_type_0 = []
                _messages_type_0 = data
                for messages_type_0_item_data in _messages_type_0:
                    messages_type_0_item = ChatMessage.from_dict(messages_type_0_item_data)

                    messages_type_0.append(messages_type_0_item)

                return messages_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[ChatMessage] | None | Unset, data)

        messages = _parse_messages(d.pop("messages", UNSET))

        _mixing = d.pop("mixing", UNSET)
        mixing: GenerateRequestMixing | Unset
        if isinstance(_mixing, Unset):
            mixing = UNSET
        else:
            mixing = check_generate_request_mixing(_mixing)

        _positions = d.pop("positions", UNSET)
        positions: GenerateRequestPositions | Unset
        if isinstance(_positions, Unset):
            positions = UNSET
        else:
            positions = check_generate_request_positions(_positions)

        def _parse_prior(data: object) -> float | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(float | None | Unset, data)

        prior = _parse_prior(d.pop("prior", UNSET))

        def _parse_prompt(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        prompt = _parse_prompt(d.pop("prompt", UNSET))

        raw = d.pop("raw", UNSET)

        refuse = d.pop("refuse", UNSET)

        def _parse_retrieval(data: object) -> GenerateRequestRetrievalType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                retrieval_type_0 = check_generate_request_retrieval_type_0(data)

                return retrieval_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(GenerateRequestRetrievalType0 | None | Unset, data)

        retrieval = _parse_retrieval(d.pop("retrieval", UNSET))

        def _parse_seed(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        seed = _parse_seed(d.pop("seed", UNSET))

        spans = d.pop("spans", UNSET)

        def _parse_stop(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                stop_type_0 = cast(list[str], data)

                return stop_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        stop = _parse_stop(d.pop("stop", UNSET))

        stream = d.pop("stream", UNSET)

        temperature = d.pop("temperature", UNSET)

        top_p = d.pop("top_p", UNSET)

        use_kb = d.pop("use_kb", UNSET)

        generate_request = cls(
            alpha=alpha,
            context=context,
            evidence=evidence,
            exact=exact,
            filter_=filter_,
            ignore_eos=ignore_eos,
            k=k,
            kb=kb,
            knn_temperature=knn_temperature,
            lexical_weight=lexical_weight,
            max_tokens=max_tokens,
            messages=messages,
            mixing=mixing,
            positions=positions,
            prior=prior,
            prompt=prompt,
            raw=raw,
            refuse=refuse,
            retrieval=retrieval,
            seed=seed,
            spans=spans,
            stop=stop,
            stream=stream,
            temperature=temperature,
            top_p=top_p,
            use_kb=use_kb,
        )

        return generate_request
