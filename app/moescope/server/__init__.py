"""An OpenAI-compatible HTTP API over one loaded engine (``moescope serve``, and the
window's *Serve API*): ``service`` runs requests on the engine's queue, ``app`` speaks
HTTP (Starlette), ``run`` puts it on uvicorn."""
