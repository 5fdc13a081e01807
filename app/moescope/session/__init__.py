"""The conversation flow every front end shares: send, stop, answer now, regenerate, recording and
its failures, chat history, the per-token snapshot.
"""
