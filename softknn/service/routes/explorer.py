"""GET /: the evidence explorer page (softknn/service/static/index.html)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from softknn.service.errors import NotFound

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter(include_in_schema=False)


@router.get("/")
async def explorer() -> FileResponse:
    page = STATIC_DIR / "index.html"
    if not page.is_file():
        raise NotFound("no explorer page in this build (softknn/service/static/index.html)")
    return FileResponse(page, media_type="text/html")
