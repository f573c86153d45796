"""The Textual chat app, its terminal runs and its conversation store."""
