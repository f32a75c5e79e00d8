"""The OpenAI-compatible HTTP server: `tensorfold serve`, or api.create_app(engine, ...)."""
