"""OpenAI's Realtime API on ``/v1/realtime``: protocol, conversation, turn detection, session."""
