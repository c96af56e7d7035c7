"""DeepSparse Server's route: POST /predict (and each endpoint's own `route`)."""

from __future__ import annotations

import time
import uuid

from fastapi import FastAPI, Request

from ..generation import GenerationRequest
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
    async def predict(body: PredictRequest, request: Request) -> PredictResponse:
        """The text-generation pipeline's input schema in, its output schema out."""
        served = state.model(endpoint.name)
        prompts = [body.sequences] if isinstance(body.sequences, str) else body.sequences
        config = state.generation_config(served, **body.generation_kwargs())
        requests = [GenerationRequest(state.encode(served, p, "sequences"), config)
                    for p in prompts]
        submission = state.submit(served, requests)
        results = await state.collect(request, served, submission)
        return PredictResponse(
            prompts=prompts,
            generations=[GeneratedTextOut(text=r.text, finished=True,
                                          finished_reason=r.finished_reason) for r in results],
            session_id=body.session_id or str(uuid.uuid4()),
            created=time.time(),
        )

    return predict
