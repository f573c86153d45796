"""Widgets of the chat app, one module per role."""
