"""What a model file says: GGUF header info, chat templates and reasoning (thinking) markers."""
