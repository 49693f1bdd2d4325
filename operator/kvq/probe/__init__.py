"""kvq.probe: quality checks of a served model against its KV-cache dtype (`kvq probe`).

`tasks` (prompts and expected answers from fixed seeds) and `scoring` are pure and
standard-library only: the training script of the engine tier imports `tasks` from the
engine venv to teach a tiny model the same formats. `client` is the only HTTP code
(the `openai` client for completions, `httpx` for `/metrics`); `runner` drives the
suites; `report` holds the JSON report and the verdict.
"""
