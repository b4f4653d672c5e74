"""The benchmark's upstream the way vLLM's and SGLang's OpenAI servers answer: a FastAPI route
returning a ``StreamingResponse`` over an async generator, under uvicorn. (FastAPI reads the
annotations of the routes at run time, so this module does not postpone them.)"""

import asyncio
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse


def serve(port: int, delay: float, *, chunks: int, chunk: bytes, usage: bytes) -> None:
    app = FastAPI()

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            for _ in range(chunks):
                yield chunk
                if delay:
                    await asyncio.sleep(delay)
            if include_usage:
                yield usage
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    uvicorn.run(app, port=port, log_level="warning", access_log=False, lifespan="off")
