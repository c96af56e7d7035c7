"""DeepSparse Server's route: POST /predict (and each endpoint's own `route`)."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..generation import GenerationRequest
from ..pipeline import stacked_logits
from .provider import Endpoint
from .schemas import GeneratedTextOut, PredictRequest, PredictResponse
from .state import ServerState


def add_predict_routes(app: FastAPI, state: ServerState, responses: dict) -> None:
    for endpoint in state.endpoints:
        for route in endpoint.routes:
            app.add_api_route(route, _handler(state, endpoint), methods=["POST"],
                              response_model=PredictResponse, responses=responses,
                              name=f"predict {endpoint.name} {route}",
                              summary=f"Generate text with {endpoint.name}",
                              tags=["pipeline"])


def _handler(state: ServerState, endpoint: Endpoint):  # noqa: ANN202
    async def predict(body: PredictRequest, request: Request) -> Any:
        """The text-generation pipeline's input schema in, its output schema out."""
        served = state.model(endpoint.name)
        prompts = [body.sequences] if isinstance(body.sequences, str) else body.sequences
        config = state.generation_config(served, **body.generation_kwargs())
        requests = [GenerationRequest(state.encode(served, p, "sequences"), config,
                                      return_logits=body.return_logits) for p in prompts]
        submission = state.submit(served, requests)
        results = await state.collect(request, served, submission)
        out = PredictResponse(
            sequences=[r.text for r in results],
            session_id=body.session_id or str(uuid.uuid4()),
            prompts=prompts,
            generations=[GeneratedTextOut(text=r.text, finished=True,
                                          finished_reason=r.finished_reason) for r in results],
            created=time.time(),
        )
        if not body.return_logits:
            return out
        # Millions of floats: encoded straight from the array, not through pydantic.
        length = served.sequence_length if body.fixed_sequences_length else None
        return JSONResponse({**out.model_dump(), "logits": _json_array(
            stacked_logits(results, length))})

    return predict


def _json_array(a: np.ndarray) -> list[Any]:
    """Nested lists for JSON; a logit that was never computed (NaN) becomes null."""
    if np.isfinite(a).all():
        return a.tolist()
    return [[[x if math.isfinite(x) else None for x in row] for row in seq] for seq in a.tolist()]
