"""The chat: the list of chats, the conversation view (markdown, code colours, thoughts), its
settings, and the controller that drives the worker.
"""
